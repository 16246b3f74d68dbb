// Settings for a command, from three sources in increasing precedence: a config file (--config,
// JSON or YAML), CELLQUOTA_* environment variables, and command-line flags. Every setting is
// declared once, as a field of the command's zod object made by `setting()`: its key names it (the
// flag is the key in kebab case, the variable CELLQUOTA_<FLAG>, the config file takes either
// spelling), the schema is its type, and the declaration holds its default, help and an example.
// The flags, the help text and the defaults all come from that one declaration (settingSpecs,
// settingsHelp); the merged result is validated by the command's schema, and a bad value is
// reported with the setting, where it came from, and why.
import { readFileSync } from 'node:fs';
import { parse as parseYaml } from 'yaml';
import type { z } from 'zod';
import { CellquotaError } from './errors.js';

/** What `setting()` declares besides the schema. */
export interface SettingMeta<D = unknown> {
  /** One line for --help, without the default (the help adds it). */
  readonly help: string;
  /** The default: a value as the setting takes it from a flag or a config file (parsed by the schema). */
  readonly default?: D;
  /** How the default reads in --help when it is derived rather than a value (e.g. "the peer host"). */
  readonly defaultHelp?: string;
  /** A valid value other than the default, as typed after the flag (shown in --help; used by tests). */
  readonly example: string;
  /** The variable when it is not CELLQUOTA_<FLAG> (kept for names older than this rule). */
  readonly env?: string;
}

const declared = new WeakMap<z.ZodType, SettingMeta>();

/**
 * Declares one setting: its schema (the type, the range) and its meta (default, help, example). With
 * a default, the schema is wrapped so a missing value takes the default (parsed like a given one).
 */
export function setting<S extends z.ZodType>(
  schema: S,
  meta: SettingMeta<NoInfer<z.input<S>>> & { readonly default: NoInfer<z.input<S>> },
): z.ZodPrefault<S>;
export function setting<S extends z.ZodType>(schema: S, meta: SettingMeta<never> & { readonly default?: undefined }): S;
export function setting<S extends z.ZodType>(schema: S, meta: SettingMeta): z.ZodType {
  if (meta.default !== undefined && meta.defaultHelp !== undefined)
    throw new Error(`setting '${meta.help}': a default or a defaultHelp, not both`);
  const out = meta.default === undefined ? schema.clone() : schema.prefault(meta.default as z.input<S>);
  declared.set(out, meta);
  return out;
}

/**
 * Another command's copy of a declared setting: the same schema and default, its own help (a
 * gateway's flag that an embedded agent applies, e.g.). The default stays the original's.
 */
export function reuseSetting<S extends z.ZodType>(schema: S, meta: Omit<Partial<SettingMeta>, 'default'>): S {
  const out = schema.clone();
  declared.set(out, { ...settingMeta(schema), ...meta });
  return out;
}

/** The declaration of a setting made by setting(), to build another command's setting from it. */
export function settingMeta(schema: z.ZodType): SettingMeta {
  const meta = declared.get(schema);
  if (meta === undefined) throw new Error('not a declared setting (see setting())');
  return meta;
}

export interface SettingSpec {
  /** The flag without dashes, e.g. 'data-dir'. The variable is CELLQUOTA_DATA_DIR. */
  readonly flag: string;
  readonly description: string;
  readonly boolean?: boolean;
  /** The default as --help shows it (undefined: none). */
  readonly defaultText?: string;
  readonly required?: boolean;
  readonly example?: string;
  /** The environment variable, when it is not envVarName(flag). */
  readonly env?: string;
}

function kebab(key: string): string {
  return key.replace(/[A-Z]/g, (c) => `-${c.toLowerCase()}`);
}

/** How a default value reads on a command line: lists comma-separated, octal modes as given. */
export function formatDefault(v: unknown): string {
  if (Array.isArray(v)) return v.length === 0 ? 'none' : v.map(String).join(',');
  if (typeof v === 'object' && v !== null) return JSON.stringify(v);
  return String(v);
}

/** The specs of a command's settings, from the fields of its schema (each made by setting()). */
export function settingSpecs(fields: z.ZodObject): readonly SettingSpec[] {
  return Object.freeze(
    Object.entries(fields.shape as Record<string, z.ZodType>).map(([key, schema]): SettingSpec => {
      const meta = settingMeta(schema);
      const defaultText = meta.default !== undefined ? formatDefault(meta.default) : meta.defaultHelp;
      return {
        flag: kebab(key),
        description: meta.help,
        ...(typeof meta.default === 'boolean' ? { boolean: true } : {}),
        ...(defaultText === undefined ? {} : { defaultText }),
        required: !schema.safeParse(undefined).success,
        example: meta.example,
        ...(meta.env === undefined ? {} : { env: meta.env }),
      };
    }),
  );
}

export class ConfigError extends CellquotaError {
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

/** The variable a setting is read from. */
export function settingVariable(spec: SettingSpec): string {
  return spec.env ?? envVarName(spec.flag);
}

function camel(flag: string): string {
  return flag.replace(/-([a-z])/g, (_, c: string) => c.toUpperCase());
}

type Source = 'flag' | 'environment' | 'config file' | 'default';

/**
 * Parses argv (after the subcommand) against the declared settings, merges file < env < flags,
 * and validates with the schema. Throws ConfigError with a message naming the setting and source.
 */
export function loadSettings<S extends z.ZodType>(
  command: string,
  specs: readonly SettingSpec[],
  schema: S,
  argv: readonly string[],
  env: NodeJS.ProcessEnv,
): z.infer<S> {
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
    if (doc !== null && (typeof doc !== 'object' || Array.isArray(doc)))
      throw new ConfigError(`${command}: config file ${configPath} must hold a mapping of settings`);
    for (const [k, v] of Object.entries((doc ?? {}) as Record<string, unknown>)) {
      const key = byFlag.has(k) ? camel(k) : k;
      if (!specs.some((s) => camel(s.flag) === key))
        throw new ConfigError(`${command}: unknown setting '${k}' in config file ${configPath}`);
      raw[key] = v;
      source.set(key, 'config file');
    }
  }
  for (const s of specs) {
    const v = env[settingVariable(s)];
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
    const where =
      spec === undefined
        ? key
        : from === 'environment'
          ? settingVariable(spec)
          : from === 'config file'
            ? `${spec.flag} (config file)`
            : `--${spec.flag}`;
    return `  ${where}: ${issue.message}`;
  });
  throw new ConfigError(`${command}: invalid settings\n${lines.join('\n')}`);
}

/** One line a setting: the flag, its help, its default (or "required") and its variable. */
export function settingsHelp(specs: readonly SettingSpec[], opts: { readonly configFile?: boolean } = {}): string {
  const width = Math.max(...specs.map((s) => s.flag.length)) + 4;
  return specs
    .map((s) => {
      const dflt =
        s.required === true ? ' (required)' : s.defaultText === undefined ? '' : ` (default ${s.defaultText})`;
      return `  --${s.flag.padEnd(width)}${s.description}${dflt} [${settingVariable(s)}]`;
    })
    .concat(
      opts.configFile === false
        ? []
        : [
            `  --${'config FILE'.padEnd(width)}the settings in a YAML or JSON file, keyed by flag name (or ` +
              'camelCase) [CELLQUOTA_CONFIG]',
          ],
    )
    .join('\n');
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
