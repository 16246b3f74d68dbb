// The simulator's event queue: a binary heap ordered by (virtual time, insertion sequence), so
// events at the same instant run in a deterministic order.

interface Scheduled {
  readonly at: number;
  readonly seq: number;
  readonly run: () => void;
}

export class EventQueue {
  private heap: Scheduled[] = [];
  private seq = 0;
  now = 0;

  schedule(at: number, run: () => void): void {
    const ev: Scheduled = { at: Math.max(at, this.now), seq: this.seq++, run };
    const h = this.heap;
    h.push(ev);
    let i = h.length - 1;
    while (i > 0) {
      const p = (i - 1) >> 1;
      const parent = h[p];
      if (parent === undefined || !less(ev, parent)) break;
      h[i] = parent;
      i = p;
    }
    h[i] = ev;
  }

  /** Runs the next event if it is due at or before `until`; false when none is. */
  runNext(until: number): boolean {
    const h = this.heap;
    const top = h[0];
    if (top === undefined || top.at > until) return false;
    const last = h.pop();
    if (last !== undefined && h.length > 0) {
      let i = 0;
      for (;;) {
        const l = 2 * i + 1;
        const r = l + 1;
        let m = i;
        let mv = last;
        const lv = h[l];
        const rv = h[r];
        if (lv !== undefined && less(lv, mv)) {
          m = l;
          mv = lv;
        }
        if (rv !== undefined && less(rv, mv)) {
          m = r;
          mv = rv;
        }
        if (m === i) break;
        h[i] = mv;
        i = m;
      }
      h[i] = last;
    }
    this.now = top.at;
    top.run();
    return true;
  }

  size(): number {
    return this.heap.length;
  }
}

function less(a: Scheduled, b: Scheduled): boolean {
  return a.at < b.at || (a.at === b.at && a.seq < b.seq);
}
