// Waiting for a condition: the one polling helper of the tests, benchmarks and drills. A test never
// sleeps a fixed time in place of a condition; it polls the condition with a generous deadline.

export interface WaitOptions {
  /** Give up after this long (default 10 s). */
  readonly timeoutMs?: number;
  /** Pause between two probes (default 50 ms). */
  readonly everyMs?: number;
  /** Appended to the error on timeout (e.g. the last output of the process under test). */
  readonly context?: () => string;
  /** An error from the probe that ends the wait at once (default: none; every error means "not yet"). */
  readonly fatal?: (error: unknown) => boolean;
}

/** What a probe returns: the awaited value, or undefined / null / false for "not yet". */
export type Probe<T> = () => T | undefined | null | false | Promise<T | undefined | null | false>;

export function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

/**
 * Polls `probe` until it returns something other than undefined, null or false, and returns that.
 * A probe that throws counts as "not yet" (unless `fatal` says otherwise); the last error is named
 * in the timeout's message, with `what` and the context.
 */
export async function waitFor<T>(what: string, probe: Probe<T>, options: WaitOptions = {}): Promise<T> {
  const timeoutMs = options.timeoutMs ?? 10_000;
  const everyMs = options.everyMs ?? 50;
  const deadline = Date.now() + timeoutMs;
  let lastError: unknown = undefined;
  for (;;) {
    try {
      const v = await probe();
      if (v !== undefined && v !== null && v !== false) return v;
    } catch (error) {
      if (options.fatal?.(error) === true) throw error;
      lastError = error;
    }
    if (Date.now() > deadline) {
      const cause =
        lastError === undefined
          ? ''
          : ` (last error: ${lastError instanceof Error ? lastError.message : JSON.stringify(lastError)})`;
      const context = options.context?.() ?? '';
      throw new Error(
        `timed out after ${timeoutMs} ms waiting for ${what}${cause}${context === '' ? '' : `\n${context.slice(-3000)}`}`,
      );
    }
    await sleep(everyMs);
  }
}
