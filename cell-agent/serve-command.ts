// What `cellquota agent` and `cellquota gateway` share around their server: reading the settings,
// starting with the exit status of a start-up error, printing, and serving until SIGINT / SIGTERM.
//
// Exit statuses: 0 after a clean stop, 2 for what the user must fix (settings, rules, the tenants
// file, the routes file), 1 when the server cannot start otherwise or fails while stopping.
import { ConfigError } from '../shared/cli-config.js';
import { CellquotaError } from '../shared/errors.js';
import type { Logger } from '../shared/logging.js';
import { QuotaConfigError } from './decide/quotas.js';
import { isRulesError } from './rules/rules-errors.js';

export interface ServeCommandIo {
  readonly stdout: { write(text: string): unknown };
  readonly stderr: { write(text: string): unknown };
  /** Where SIGINT / SIGTERM come from (process by default). */
  readonly signals: Pick<NodeJS.Process, 'once' | 'off'>;
}

export type Started<T> = { readonly ok: true; readonly value: T } | { readonly ok: false; readonly exitCode: number };

/** The settings `load` reads, or the exit status of bad ones (the ConfigError's message on stderr). */
export function settingsOrExit<T>(io: ServeCommandIo, load: () => T): Started<T> {
  try {
    return { ok: true, value: load() };
  } catch (error) {
    return configErrorExit(io, error);
  }
}

/**
 * settingsOrExit for settings read asynchronously (the agent's, in a thread of their own): bad
 * settings exit as there; a reading that fails otherwise (the thread's own error, whose message names
 * the command) exits 1 with its message on stderr.
 */
export async function settingsOrExitAsync<T>(io: ServeCommandIo, load: () => Promise<T>): Promise<Started<T>> {
  try {
    return { ok: true, value: await load() };
  } catch (error) {
    if (error instanceof ConfigError) return configErrorExit(io, error);
    io.stderr.write(`${error instanceof Error ? error.message : String(error)}\n`);
    return { ok: false, exitCode: 1 };
  }
}

function configErrorExit(io: ServeCommandIo, error: unknown): Started<never> {
  if (!(error instanceof ConfigError)) throw error;
  io.stderr.write(`${error.message}\n`);
  return { ok: false, exitCode: error.exitCode };
}

/** A bad routes file? routes.ts (zod) is imported only here, on the error path, not by every start. */
async function isRoutesError(error: unknown): Promise<boolean> {
  if (!(error instanceof CellquotaError)) return false;
  const { RoutesError } = await import('./front-door/routes.js');
  return error instanceof RoutesError;
}

/** Starts the server, or the exit status of why it cannot start (the message on stderr). */
export async function startOrExit<T>(
  io: ServeCommandIo,
  command: string,
  start: () => Promise<T>,
): Promise<Started<T>> {
  try {
    return { ok: true, value: await start() };
  } catch (error) {
    const message = error instanceof Error ? error.message : String(error);
    const usersToFix =
      error instanceof ConfigError ||
      isRulesError(error) ||
      error instanceof QuotaConfigError ||
      (await isRoutesError(error));
    io.stderr.write(usersToFix ? `${command}: ${message}\n` : `${command}: cannot start: ${message}\n`);
    return { ok: false, exitCode: usersToFix ? 2 : 1 };
  }
}

/** Serves until the first SIGINT or SIGTERM, then stops: 0 after a clean stop, 1 if stopping failed. */
export async function serveUntilSignal(
  io: ServeCommandIo,
  logger: Logger,
  command: string,
  stop: () => Promise<void>,
): Promise<number> {
  const signal = await new Promise<NodeJS.Signals>((resolveSignal) => {
    const on = (s: NodeJS.Signals): void => {
      io.signals.off('SIGINT', on);
      io.signals.off('SIGTERM', on);
      resolveSignal(s);
    };
    io.signals.once('SIGINT', on);
    io.signals.once('SIGTERM', on);
  });
  logger.info({ signal }, 'stopping');
  try {
    await stop();
  } catch (error) {
    io.stderr.write(`${command}: error while stopping: ${error instanceof Error ? error.message : String(error)}\n`);
    return 1;
  }
  return 0;
}
