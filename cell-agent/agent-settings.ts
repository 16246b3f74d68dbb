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
 * Reads and validates the agent's settings, in a worker thread (waiting until it is gone) unless told not to.
 * Throws ConfigError (bad settings: the message says which and why), or Error when the thread fails.
 */
export async function loadAgentSettings(
  command: string,
  argv: readonly string[],
  env: NodeJS.ProcessEnv,
  options: { readonly thread?: boolean } = {},
): Promise<AgentConfig> {
  const request: SettingsRequest = { command, argv: [...argv], env: { ...env } };
  const thread = options.thread ?? !import.meta.url.endsWith('.ts');
  const got = thread
    ? await answerFromThread(request)
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

/** The settings thread's answer, once the thread is gone. */
async function answerFromThread(request: SettingsRequest): Promise<SettingsAnswer> {
  const worker = moduleWorker(import.meta.url, './agent-settings-thread', { workerData: request });
  let answer: SettingsAnswer | null = null;
  worker.once('message', (m: SettingsAnswer) => (answer = m));
  const exitCode = await new Promise<number>((resolve, reject) => {
    worker.once('error', reject);
    worker.once('exit', resolve);
  });
  const got = answer as SettingsAnswer | null;
  if (got === null) throw new Error(`${request.command}: the settings thread exited (${exitCode}) without an answer`);
  return got;
}
