// cellquota live view: polls api/state every POLL_MS (the cells report every 500 ms), renders the
// cluster, the bound, the cells, one page of tenants and the chosen tenant (slices + a uPlot chart of
// its last 5 minutes). No framework; every value is set with textContent (no HTML from the server).
(function () {
  'use strict';
  var POLL_MS = 500;
  var TIMEOUT_MS = 2000;
  /** Failed polls in a row before the page moves to another replica of the cluster. */
  var FAILOVER_AFTER = 3;
  var COLORS = ['#0b5cad', '#c2410c', '#15803d', '#7c3aed', '#be123c', '#0e7490', '#a16207', '#4d7c0f'];

  var view = { q: '', page: 0, size: 50, sort: 'busy', tenant: tenantFromHash(), cursor: 0 };
  var last = null; // the last document
  var lastOkAt = 0;
  var fails = 0;
  var chart = null;
  var chartKey = '';
  var inflight = null;

  function $(id) {
    return document.getElementById(id);
  }
  function el(tag, text, cls) {
    var e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = String(text);
    if (cls) e.className = cls;
    return e;
  }
  function fmt(x, digits) {
    if (x === null || x === undefined) return '–';
    if (typeof x !== 'number') return String(x);
    var d = digits === undefined ? (Math.abs(x) >= 100 ? 0 : 1) : digits;
    return x.toLocaleString('en-US', { maximumFractionDigits: d, minimumFractionDigits: 0 });
  }
  function ratioClass(r) {
    return r === null || r === undefined ? '' : r > 1 ? 'bad' : r > 0.95 ? 'warn' : 'ok';
  }
  function ago(ms, now) {
    if (ms === null || ms === undefined) return 'never';
    var s = Math.max(0, (now - ms) / 1000);
    return s < 60 ? s.toFixed(1) + ' s ago' : Math.round(s / 60) + ' min ago';
  }
  function tenantFromHash() {
    var m = /(?:^#|&)tenant=([^&]*)/.exec(location.hash);
    return m ? decodeURIComponent(m[1]) : null;
  }
  function replaceRows(tbody, rows) {
    var frag = document.createDocumentFragment();
    rows.forEach(function (r) {
      frag.appendChild(r);
    });
    tbody.replaceChildren(frag);
  }
  function row(cells) {
    var tr = document.createElement('tr');
    cells.forEach(function (c) {
      tr.appendChild(c);
    });
    return tr;
  }
  function td(text, cls) {
    return el('td', text, cls);
  }

  // ---- polling -------------------------------------------------------------------------------
  function query() {
    var p = new URLSearchParams();
    if (view.q) p.set('q', view.q);
    p.set('page', String(view.page));
    p.set('size', String(view.size));
    p.set('sort', view.sort);
    if (view.tenant) p.set('tenant', view.tenant);
    return p.toString();
  }

  function poll() {
    var started = Date.now();
    var ctrl = new AbortController();
    var timer = setTimeout(function () {
      ctrl.abort();
    }, TIMEOUT_MS);
    inflight = ctrl;
    fetch('api/state?' + query(), { cache: 'no-store', credentials: 'same-origin', signal: ctrl.signal })
      .then(function (res) {
        if (res.status === 401) {
          location.reload();
          throw new Error('logged out');
        }
        if (!res.ok) throw new Error('HTTP ' + res.status);
        return res.json();
      })
      .then(function (doc) {
        fails = 0;
        lastOkAt = Date.now();
        last = doc;
        render(doc);
      })
      .catch(function (err) {
        if (ctrl !== inflight) return; // superseded by a newer request (the view changed)
        fails++;
        renderStatus(err && err.message ? err.message : String(err));
        if (fails >= FAILOVER_AFTER) failover();
      })
      .finally(function () {
        clearTimeout(timer);
        if (ctrl !== inflight) return;
        setTimeout(poll, Math.max(0, POLL_MS - (Date.now() - started)));
      });
  }

  /** Re-polls at once (the view changed): the newer request wins. */
  function refresh() {
    if (inflight) inflight.abort();
    inflight = null;
    poll();
  }

  /** This replica stopped answering: go to another member's live view (same host: the session cookie goes too). */
  function failover() {
    if (!last) return;
    var self = last.servedBy || last.cluster.self;
    var others = last.cluster.members.filter(function (m) {
      return m.id !== self && m.adminUrl;
    });
    var leader = others.filter(function (m) {
      return m.id === last.cluster.leader;
    })[0];
    var pick = leader || others[Math.floor(Math.random() * others.length)];
    if (!pick) return;
    renderStatus('this replica (' + self + ') stopped answering: moving to ' + pick.id);
    location.href = pick.adminUrl + '/ui/' + location.hash;
  }

  // ---- rendering -----------------------------------------------------------------------------
  function renderStatus(error) {
    var s = $('status');
    if (error) {
      s.className = 'status stale';
      s.textContent = 'not updating: ' + error + (lastOkAt ? ' (last update ' + ago(lastOkAt, Date.now()) + ')' : '');
      return;
    }
    s.className = 'status live';
    s.textContent =
      'live · built by ' +
      last.builtBy +
      (last.servedBy && last.servedBy !== last.builtBy ? ' for ' + last.servedBy : '') +
      (last.note ? ' · ' + last.note : '');
  }

  function render(doc) {
    renderStatus(null);
    var c = doc.cluster;
    $('cluster-id').textContent = c.clusterId;
    $('leader').textContent = c.leader === null ? 'none (election)' : c.leader;
    $('leader').className = c.leader === null ? 'bad' : '';
    $('term').textContent = fmt(c.term, 0);
    $('commit').textContent = fmt(c.commitIndex, 0);
    $('served').textContent = doc.servedBy || c.self;
    replaceRows(
      $('members'),
      c.members.map(function (m) {
        var name = td(null);
        if (m.adminUrl) {
          var a = el('a', m.id);
          a.href = m.adminUrl + '/ui/';
          name.appendChild(a);
        } else name.textContent = m.id;
        return row([
          name,
          td(m.role + (m.voter ? '' : ' (learner)'), m.role === 'leader' ? 'ok' : ''),
          td(m.reachable === null ? '?' : m.reachable ? 'yes' : 'no', m.reachable === false ? 'bad' : ''),
          td(fmt(m.match, 0), 'num'),
        ]);
      }),
    );

    var o = doc.overshoot;
    $('overshoot').textContent = o.peakRatio === null ? '–' : o.peakRatio.toFixed(3);
    $('overshoot').className = ratioClass(o.peakRatio);
    $('peak-quota').textContent = o.peakQuota || '–';
    $('windows-over').textContent = fmt(o.windowsOver, 0);
    $('windows-over').className = o.windowsOver > 0 ? 'bad' : '';
    $('windows').textContent = fmt(o.windows, 0);
    var fo = doc.cells.reduce(function (s, x) {
      return x.failOpenPerS === null ? s : (s || 0) + x.failOpenPerS;
    }, null);
    $('failopen').textContent = fmt(fo);

    replaceRows(
      $('cells'),
      doc.cells.map(function (x) {
        return row([
          td(x.id),
          td(ago(x.lastReportAt, doc.at)),
          td(x.leaseLive ? 'lease' : 'floors', x.leaseLive ? 'leased' : 'floor'),
          td(fmt(x.failOpenPerS), 'num'),
          td(fmt(x.failOpenTotal, 0), 'num'),
        ]);
      }),
    );

    var t = doc.tenants;
    $('tenant-count').textContent =
      fmt(t.total, 0) + ' in the ledger' + (t.matched !== t.total ? ', ' + fmt(t.matched, 0) + ' match' : '');
    var first = t.page * t.size;
    $('page-info').textContent =
      t.matched === 0
        ? 'none'
        : first + 1 + '–' + Math.min(first + t.rows.length, t.matched) + ' of ' + fmt(t.matched, 0);
    $('prev').disabled = t.page === 0;
    $('next').disabled = first + t.size >= t.matched;
    if (view.cursor >= t.rows.length) view.cursor = Math.max(0, t.rows.length - 1);
    replaceRows(
      $('tenants'),
      t.rows.map(function (r, i) {
        var tr = row([
          td(r.id),
          td(r.tier),
          td(fmt(r.rate), 'num'),
          td(fmt(r.burst), 'num'),
          td(fmt(r.admittedPerS), 'num'),
          td(fmt(r.refusedPerS), 'num'),
          td(
            r.ratio === null ? '–' : r.ratio.toFixed(2) + ' / ' + r.peakRatio.toFixed(2),
            'num ' + ratioClass(r.peakRatio),
          ),
          td(
            r.slices
              .map(function (s) {
                return s.cellId + ': ' + fmt(s.rate) + ' · ' + s.source + (s.epoch ? ' · e' + s.epoch : '');
              })
              .join('   '),
            'slices',
          ),
        ]);
        tr.dataset.tenant = r.id;
        tr.tabIndex = -1;
        if (i === view.cursor) tr.className = 'cursor';
        if (r.id === view.tenant) tr.className += ' chosen';
        tr.setAttribute('aria-selected', r.id === view.tenant ? 'true' : 'false');
        tr.addEventListener('click', function () {
          view.cursor = i;
          choose(r.id);
        });
        return tr;
      }),
    );
    renderDetail(doc);
  }

  function renderDetail(doc) {
    var s = doc.selected;
    var title = $('detail-title');
    if (!s) {
      title.textContent = view.tenant ? 'No tenant ' + view.tenant : 'Choose a tenant';
      title.appendChild(el('span', ' (↑ ↓ or j k, Enter)', 'sub'));
      replaceRows($('slices'), []);
      if (chart) {
        chart.destroy();
        chart = null;
        chartKey = '';
      }
      $('chart-note').textContent = '';
      return;
    }
    title.textContent = 'Tenant ' + s.id + ' ';
    title.appendChild(
      el(
        'span',
        'tier ' +
          s.tier +
          ' · ' +
          fmt(s.rate) +
          '/s, burst ' +
          fmt(s.burst) +
          ' · admitted ' +
          fmt(s.admittedPerS) +
          '/s · ÷ bound ' +
          (s.ratio === null ? '–' : s.ratio.toFixed(3)),
        'sub',
      ),
    );
    replaceRows(
      $('slices'),
      s.slices.map(function (x) {
        return row([
          td(x.cellId),
          td(x.source === 'leased' ? 'lease' : 'floor', x.source === 'leased' ? 'leased' : 'floor'),
          td(fmt(x.epoch, 0), 'num'),
          td(fmt(x.rate), 'num'),
          td(fmt(x.burst), 'num'),
          td(fmt(x.admittedPerS), 'num'),
          td(fmt(x.refusedPerS), 'num'),
        ]);
      }),
    );
    drawChart(s.history, s);
  }

  function drawChart(h, s) {
    var box = $('chart');
    if (!h || typeof uPlot === 'undefined') {
      if (chart) {
        chart.destroy();
        chart = null;
        chartKey = '';
      }
      $('chart-note').textContent = !h
        ? last && last.rates
          ? 'no traffic from ' + s.id + ' in the last 5 minutes'
          : 'history is kept by the leader'
        : '';
      return;
    }
    $('chart-note').textContent =
      "solid: admitted/s per cell · dashed: the cell's slice (rate in force) · " +
      'black: the quota · grey: all cells together';
    var xs = h.times.map(function (t) {
      return t / 1000;
    });
    var total = h.times.map(function (_t, i) {
      var sum = null;
      h.cells.forEach(function (c) {
        var v = c.admitted[i];
        if (v !== null) sum = (sum || 0) + v;
      });
      return sum;
    });
    var data = [xs, h.quota, total];
    var series = [
      {},
      { label: 'quota', stroke: '#1b1f24', width: 2 },
      { label: 'all cells', stroke: '#9aa4ae', width: 1.5 },
    ];
    h.cells.forEach(function (c, i) {
      var color = COLORS[i % COLORS.length];
      data.push(c.admitted, c.limit);
      series.push(
        { label: c.cellId + ' admitted', stroke: color, width: 1.5 },
        { label: c.cellId + ' slice', stroke: color, width: 1, dash: [5, 4] },
      );
    });
    var key =
      s.id +
      '|' +
      h.cells
        .map(function (c) {
          return c.cellId;
        })
        .join(',');
    var width = Math.max(300, box.clientWidth);
    if (chart && chartKey === key) {
      chart.setData(data);
      if (Math.abs(chart.width - width) > 4) chart.setSize({ width: width, height: 240 });
      return;
    }
    if (chart) chart.destroy();
    chartKey = key;
    chart = new uPlot(
      {
        width: width,
        height: 240,
        series: series,
        scales: {
          x: { time: true },
          y: {
            range: function (_u, _min, max) {
              return [0, Math.max(1, max) * 1.1];
            },
          },
        },
        axes: [{}, { label: 'req/s', size: 56 }],
        legend: { live: false },
      },
      data,
      box,
    );
  }

  // ---- interaction ---------------------------------------------------------------------------
  function choose(id) {
    view.tenant = id;
    history.replaceState(null, '', '#tenant=' + encodeURIComponent(id));
    if (last) render(last);
    refresh();
  }
  function moveCursor(d) {
    var rows = $('tenants').rows;
    if (!rows.length) return;
    view.cursor = Math.min(rows.length - 1, Math.max(0, view.cursor + d));
    for (var i = 0; i < rows.length; i++) rows[i].classList.toggle('cursor', i === view.cursor);
    rows[view.cursor].scrollIntoView({ block: 'nearest' });
    rows[view.cursor].focus({ preventScroll: true });
  }
  function page(d) {
    if (!last) return;
    var t = last.tenants;
    var next = view.page + d;
    if (next < 0 || next * t.size >= Math.max(1, t.matched)) return;
    view.page = next;
    view.cursor = 0;
    refresh();
  }

  var searchTimer = null;
  $('search').addEventListener('input', function (e) {
    clearTimeout(searchTimer);
    searchTimer = setTimeout(function () {
      view.q = e.target.value.trim();
      view.page = 0;
      view.cursor = 0;
      refresh();
    }, 120);
  });
  $('search').addEventListener('keydown', function (e) {
    if (e.key === 'Escape') {
      e.target.blur();
    }
    if (e.key === 'Enter' || e.key === 'ArrowDown') {
      e.preventDefault();
      e.target.blur();
      moveCursor(0);
    }
  });
  $('sort').addEventListener('change', function (e) {
    view.sort = e.target.value;
    view.page = 0;
    refresh();
  });
  $('prev').addEventListener('click', function () {
    page(-1);
  });
  $('next').addEventListener('click', function () {
    page(1);
  });
  document.addEventListener('keydown', function (e) {
    var tag = e.target && e.target.tagName;
    if (tag === 'INPUT' || tag === 'SELECT' || tag === 'TEXTAREA' || e.ctrlKey || e.metaKey || e.altKey) return;
    var rows = $('tenants').rows;
    switch (e.key) {
      case '/':
        e.preventDefault();
        $('search').focus();
        $('search').select();
        break;
      case 'ArrowDown':
      case 'j':
        e.preventDefault();
        moveCursor(1);
        break;
      case 'ArrowUp':
      case 'k':
        e.preventDefault();
        moveCursor(-1);
        break;
      case 'Enter':
        if (rows[view.cursor]) {
          e.preventDefault();
          choose(rows[view.cursor].dataset.tenant);
        }
        break;
      case ']':
      case 'PageDown':
        e.preventDefault();
        page(1);
        break;
      case '[':
      case 'PageUp':
        e.preventDefault();
        page(-1);
        break;
      case 's':
        $('sort').value = view.sort = view.sort === 'busy' ? 'id' : 'busy';
        view.page = 0;
        refresh();
        break;
      default:
        break;
    }
  });
  window.addEventListener('hashchange', function () {
    var t = tenantFromHash();
    if (t !== view.tenant) {
      view.tenant = t;
      refresh();
    }
  });
  window.addEventListener('resize', function () {
    if (chart) chart.setSize({ width: Math.max(300, $('chart').clientWidth), height: 240 });
  });
  setInterval(function () {
    if (lastOkAt && Date.now() - lastOkAt > 2 * TIMEOUT_MS)
      renderStatus('no answer for ' + ago(lastOkAt, Date.now()).replace(' ago', ''));
  }, 1000);
  poll();
})();
