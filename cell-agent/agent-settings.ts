// The agent's settings (flags, CELLQUOTA_* variables, --config; agent-config.ts) are read and
// validated with zod in a short-lived worker thread (agent-settings-thread.ts), which posts the
// validated AgentConfig back and exits. zod and the settings' schemas then live only in that
// thread's isolate, which V8 frees when the thread ends: a module graph imported by the main thread
// stays for the life of the process, and zod 4 with the agent's schemas grows the main thread's heap
// (old and young generation) by ~15 MiB resident (bench/agent-idle-rss.ts, cell-agent/README.md).
// The thread costs the start-up ~50 ms on a quiet machine. Run from source (tsx: tests, `npx tsx`)
// the settings are read in this thread by default, as a thread booting tsx would cost each start a
// second or more on a loaded machine; `thread: true` forces the thread (its test).
import { ConfigError } from '../shared/cli-config.js';
import { parseTrustedProxies } from '../shared/client-address.js';
import { moduleWorker } from '../shared/module-worker.js';
import type { AgentConfig } from './agent-config.js';

/**
 * AgentConfig as it crosses threads (structured clone): its one field that holds code (the trusted
 * proxies' matcher) as the entries it was parsed from. A new field that does not clone fails every
 * start with a DataCloneError, which the agent's tests meet at once.
 */
export type ClonedAgentConfig = Omit<AgentConfig, 'trustedProxies'> & { readonly trustedProxies: readonly string[] };

/** What the settings thread is given. */
export interface SettingsRequest {
  readonly command: string;
  readonly argv: readonly string[];
  readonly env: Readonly<Record<string, string | undefined>>;
}

/** What the settings thread answers. */
export type SettingsAnswer =
  | { readonly kind: 'ok'; readonly config: ClonedAgentConfig }
  | { readonly kind: 'config-error'; readonly message: string }
  | { readonly kind: 'error'; readonly message: string };

/**
 * How long the settings thread may take to answer: a built agent's answers in ~50 ms, from source
 * (tsx) or on a loaded machine in seconds; past this the start fails with an error saying so.
 */
export const SETTINGS_THREAD_DEADLINE_MS = 30_000;
/** How long the start waits, once it has the answer, for the thread's isolate to be gone. */
const SETTINGS_THREAD_END_MS = 5_000;

/**
 * Reads and validates the agent's settings, in a worker thread (ended once it answered) unless told not to.
 * Throws ConfigError (bad settings: the message says which and why), or Error when the thread fails
 * or gives no answer within `deadlineMs`.
 */
export async function loadAgentSettings(
  command: string,
  argv: readonly string[],
  env: NodeJS.ProcessEnv,
  options: { readonly thread?: boolean; readonly deadlineMs?: number } = {},
): Promise<AgentConfig> {
  const request: SettingsRequest = { command, argv: [...argv], env: { ...env } };
  const thread = options.thread ?? !import.meta.url.endsWith('.ts');
  const got = thread
    ? await answerFromThread(request, options.deadlineMs ?? SETTINGS_THREAD_DEADLINE_MS)
    : (await import('./agent-settings-read.js')).readAgentSettings(request);
  switch (got.kind) {
    case 'ok':
      return { ...got.config, trustedProxies: parseTrustedProxies(got.config.trustedProxies) };
    case 'config-error':
      throw new ConfigError(got.message);
    case 'error':
      throw new Error(got.message);
  }
}

/** The settings thread's answer, taken as it is posted; the thread is then ended (its isolate freed). */
async function answerFromThread(request: SettingsRequest, deadlineMs: number): Promise<SettingsAnswer> {
  const worker = moduleWorker(import.meta.url, './agent-settings-thread', { workerData: request });
  let deadline: NodeJS.Timeout | undefined;
  try {
    return await new Promise<SettingsAnswer>((resolve, reject) => {
      worker.once('message', resolve);
      worker.once('error', reject);
      worker.once('exit', (code) =>
        reject(new Error(`${request.command}: the settings thread exited (${code}) without an answer`)),
      );
      deadline = setTimeout(
        () => reject(new Error(`${request.command}: the settings thread gave no answer within ${deadlineMs} ms`)),
        deadlineMs,
      );
    });
  } finally {
    clearTimeout(deadline);
    // zod and the schemas go with the thread's isolate before the agent allocates its own start-up;
    // a thread that does not end in time is left to end by itself, never holding the process open.
    let ended: NodeJS.Timeout | undefined;
    await Promise.race([
      worker.terminate(),
      new Promise<void>((resolve) => (ended = setTimeout(resolve, SETTINGS_THREAD_END_MS))),
    ]);
    clearTimeout(ended);
    worker.unref();
  }
}
