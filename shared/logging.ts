// One pino root logger per process, a child per component. Untrusted data goes under named keys,
// never spread into the top level of a line.
import { pino, type Logger, type LevelWithSilent } from 'pino';

export type { Logger } from 'pino';

export const logLevels = ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'] as const;

export function createRootLogger(opts: {
  level: LevelWithSilent;
  name: string;
  base?: Record<string, string>;
}): Logger {
  return pino({
    name: opts.name,
    level: opts.level,
    base: { pid: process.pid, ...opts.base },
    timestamp: pino.stdTimeFunctions.isoTime,
  });
}

export function componentLogger(root: Logger, component: string): Logger {
  return root.child({ component });
}
