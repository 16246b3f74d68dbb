// Reads and validates the agent's settings (zod): what the settings thread runs (agent-settings.ts).
import { ConfigError, loadSettings } from '../shared/cli-config.js';
import { AGENT_SETTING_SPECS, agentConfigSchema } from './agent-config.js';
import type { SettingsAnswer, SettingsRequest } from './agent-settings.js';

/** The settings of `request`, or why they are bad, in the form that crosses threads. */
export function readAgentSettings(request: SettingsRequest): SettingsAnswer {
  try {
    const config = loadSettings(request.command, AGENT_SETTING_SPECS, agentConfigSchema, request.argv, request.env);
    return { kind: 'ok', config: { ...config, trustedProxies: config.trustedProxies.entries } };
  } catch (error) {
    if (error instanceof ConfigError) return { kind: 'config-error', message: error.message };
    return { kind: 'error', message: error instanceof Error ? (error.stack ?? error.message) : String(error) };
  }
}
