// The bound a global quota promises, measured over admitted checks (docs/quota-model.md, "The bound"):
// in any window of W seconds of send time, at most rate·(W + u) + burst admitted, u the longest
// latency of an admitted answer sent in the window (the decision lies between send and answer).

/** One admitted check: when it was sent and answered (ms, one monotonic clock). */
export interface AdmittedCheck {
  readonly sentMs: number;
  readonly answeredMs: number;
}

export interface WorstWindow {
  readonly seconds: number;
  readonly admitted: number;
  readonly bound: number;
  readonly fromMs: number;
}

/** The window of `seconds` of send time whose admitted checks come closest to (or go furthest beyond) its bound. */
export function worstWindow(all: readonly AdmittedCheck[], seconds: number, rate: number, burst: number): WorstWindow {
  const sorted = [...all].sort((a, b) => a.sentMs - b.sentMs);
  let worst: WorstWindow = { seconds, admitted: 0, bound: rate * seconds + burst, fromMs: 0 };
  let margin = -Infinity;
  for (let i = 0; i < sorted.length; i++) {
    const from = (sorted[i] as AdmittedCheck).sentMs;
    let u = 0;
    let n = 0;
    for (let j = i; j < sorted.length && (sorted[j] as AdmittedCheck).sentMs < from + seconds * 1000; j++) {
      const a = sorted[j] as AdmittedCheck;
      u = Math.max(u, (a.answeredMs - a.sentMs) / 1000);
      n++;
    }
    const bound = rate * (seconds + u) + burst;
    if (n - bound > margin) {
      margin = n - bound;
      worst = { seconds, admitted: n, bound, fromMs: from };
    }
  }
  return worst;
}
