// Settings for a command, from three sources in increasing precedence: a config file (--config,
// JSON or YAML), CELLQUOTA_* environment variables, and command-line flags. Every setting is
// declared once (flag, variable, description); the merged result is validated by the command's zod
// schema, and a bad value is reported with the setting, where it came from, and why.
import { readFileSync } from 'node:fs';
import { parse as parseYaml } from 'yaml';
import type { z } from 'zod';

export interface SettingSpec {
  /** The flag without dashes, e.g. 'data-dir'. The variable is CELLQUOTA_DATA_DIR. */
  readonly flag: string;
  readonly description: string;
  readonly boolean?: boolean;
}

export class ConfigError extends Error {
  readonly code = 'CONFIG_INVALID';
  readonly exitCode = 2;
  constructor(message: string) {
    super(message);
    this.name = 'ConfigError';
  }
}

export function envVarName(flag: string): string {
  return `CELLQUOTA_${flag.toUpperCase().replace(/-/g, '_')}`;
}

function camel(flag: string): string {
  return flag.replace(/-([a-z])/g, (_, c: string) => c.toUpperCase());
}

type Source = 'flag' | 'environment' | 'config file' | 'default';

/**
 * Parses argv (after the subcommand) against the declared settings, merges file < env < flags,
 * and validates with the schema. Throws ConfigError with a message naming the setting and source.
 */
export function loadSettings<S extends z.ZodType>(command: string, specs: readonly SettingSpec[], schema: S, argv: readonly string[], env: NodeJS.ProcessEnv): z.infer<S> {
  const byFlag = new Map(specs.map((s) => [s.flag, s]));
  const raw: Record<string, unknown> = {};
  const source = new Map<string, Source>();
  const flagValues: Record<string, unknown> = {};
  let configPath = env['CELLQUOTA_CONFIG'];
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i] ?? '';
    if (!arg.startsWith('--')) throw new ConfigError(`${command}: unexpected argument '${arg}' (see --help)`);
    const eq = arg.indexOf('=');
    const name = eq >= 0 ? arg.slice(2, eq) : arg.slice(2);
    if (name === 'config') {
      configPath = eq >= 0 ? arg.slice(eq + 1) : argv[++i];
      if (configPath === undefined) throw new ConfigError(`${command}: --config needs a file path`);
      continue;
    }
    const spec = byFlag.get(name);
    if (spec === undefined) throw new ConfigError(`${command}: unknown flag --${name} (see --help)`);
    if (spec.boolean === true) {
      flagValues[camel(name)] = eq >= 0 ? arg.slice(eq + 1) !== 'false' : true;
      continue;
    }
    const value = eq >= 0 ? arg.slice(eq + 1) : argv[++i];
    if (value === undefined) throw new ConfigError(`${command}: --${name} needs a value`);
    flagValues[camel(name)] = value;
  }
  if (configPath !== undefined) {
    let text: string;
    try {
      text = readFileSync(configPath, 'utf8');
    } catch (err) {
      throw new ConfigError(`${command}: cannot read config file ${configPath}: ${(err as Error).message}`);
    }
    let doc: unknown;
    try {
      doc = parseYaml(text); // YAML is a superset of JSON
    } catch (err) {
      throw new ConfigError(`${command}: config file ${configPath} is not valid YAML/JSON: ${(err as Error).message}`);
    }
    if (doc !== null && (typeof doc !== 'object' || Array.isArray(doc))) throw new ConfigError(`${command}: config file ${configPath} must hold a mapping of settings`);
    for (const [k, v] of Object.entries((doc ?? {}) as Record<string, unknown>)) {
      const key = byFlag.has(k) ? camel(k) : k;
      if (!specs.some((s) => camel(s.flag) === key)) throw new ConfigError(`${command}: unknown setting '${k}' in config file ${configPath}`);
      raw[key] = v;
      source.set(key, 'config file');
    }
  }
  for (const s of specs) {
    const v = env[envVarName(s.flag)];
    if (v === undefined) continue;
    raw[camel(s.flag)] = s.boolean === true ? v !== 'false' && v !== '0' : v;
    source.set(camel(s.flag), 'environment');
  }
  for (const [k, v] of Object.entries(flagValues)) {
    raw[k] = v;
    source.set(k, 'flag');
  }
  const parsed = schema.safeParse(raw);
  if (parsed.success) return parsed.data;
  const lines = parsed.error.issues.map((issue) => {
    const key = String(issue.path[0] ?? '');
    const spec = specs.find((s) => camel(s.flag) === key);
    const from = source.get(key) ?? 'default';
    const where = spec === undefined ? key : from === 'environment' ? envVarName(spec.flag) : from === 'config file' ? `${spec.flag} (config file)` : `--${spec.flag}`;
    return `  ${where}: ${issue.message}`;
  });
  throw new ConfigError(`${command}: invalid settings\n${lines.join('\n')}`);
}

export function settingsHelp(specs: readonly SettingSpec[]): string {
  const width = Math.max(...specs.map((s) => s.flag.length)) + 4;
  return specs.map((s) => `  --${s.flag.padEnd(width)}${s.description} [${envVarName(s.flag)}]`).join('\n');
}

/** 'host:port' with a port in 0..65535. */
export function parseHostPort(v: string): { host: string; port: number } | null {
  const i = v.lastIndexOf(':');
  if (i <= 0) return null;
  const host = v.slice(0, i).replace(/^\[(.*)\]$/, '$1');
  const port = Number(v.slice(i + 1));
  if (!Number.isInteger(port) || port < 0 || port > 65535 || host.length === 0) return null;
  return { host, port };
}
