// Loggers for code under test: one whose records are kept in memory (parsed) for assertions, and
// one that says nothing.
import { Writable } from 'node:stream';
import { pino } from 'pino';
import type { Logger } from 'pino';

export interface CapturedLogger {
  readonly logger: Logger;
  readonly lines: Record<string, unknown>[];
}

/** A pino logger whose records are kept in memory (parsed). */
export function captureLogger(level = 'info'): CapturedLogger {
  const lines: Record<string, unknown>[] = [];
  const stream = new Writable({
    write(chunk: Buffer, _enc, cb) {
      for (const line of chunk.toString('utf8').split('\n')) {
        if (line.trim() !== '') lines.push(JSON.parse(line) as Record<string, unknown>);
      }
      cb();
    },
  });
  return { logger: pino({ level }, stream), lines };
}
