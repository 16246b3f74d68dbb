// Every setting of every command is declared once (shared/cli-config.ts setting()): the real
// `cellquota <command> --help` lists each one with its default (or "required") and its variable,
// and a setting given as a flag, as its environment variable or in a config file parses to the
// same value — one that differs from its default, so the value given is the value used.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { inspect } from 'node:util';
import type { z } from 'zod';
import { loadSettings, settingSpecs, settingVariable, type SettingSpec } from '../../shared/cli-config.js';
import { agentConfigFields } from '../../cell-agent/agent-config.js';
import { gatewayConfigFields } from '../../cell-agent/gateway/gateway-config.js';
import { coordinatorFields } from '../../cli/coordinator-command.js';
import { ctlFields } from '../../cli/ctl-command.js';
import { devFields } from '../../cli/dev-command.js';

const cli = resolve(import.meta.dirname, '../../cli/main.ts');

const commands: readonly { readonly name: string; readonly fields: z.ZodObject }[] = [
  { name: 'agent', fields: agentConfigFields },
  { name: 'coordinator', fields: coordinatorFields },
  { name: 'gateway', fields: gatewayConfigFields },
  { name: 'dev', fields: devFields },
  { name: 'ctl', fields: ctlFields },
];

function escape(s: string): string {
  return s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
}

/** A value as a comparable text (Maps, URLs and host/port objects included). */
function shown(v: unknown): string {
  return inspect(v, { depth: 10, sorted: true });
}

void test('--help of every command lists each declared setting with its default and its variable', () => {
  for (const { name, fields } of commands) {
    const specs = settingSpecs(fields);
    const r = spawnSync(process.execPath, ['--import', 'tsx', cli, name, '--help'], {
      encoding: 'utf8',
      timeout: 60_000,
    });
    assert.equal(r.status, 0, `${name} --help: ${r.stderr}`);
    const lines = r.stdout.split('\n');
    for (const s of specs) {
      const line = lines.find((l) => new RegExp(`^\\s+--${escape(s.flag)}\\s`).test(l));
      assert.ok(line !== undefined, `cellquota ${name} --help lists --${s.flag}`);
      assert.ok(line.includes(s.description), `${name} --${s.flag}: its help`);
      assert.ok(line.endsWith(`[${settingVariable(s)}]`), `${name} --${s.flag}: its variable ${settingVariable(s)}`);
      if (s.required === true) assert.match(line, /\(required\)/, `${name} --${s.flag} is required`);
      else if (s.defaultText !== undefined)
        assert.ok(
          line.includes(`(default ${s.defaultText})`),
          `${name} --${s.flag}: (default ${s.defaultText}) in: ${line}`,
        );
    }
  }
});

void test('a setting as a flag, as its variable and in a config file gives the same value, not the default', () => {
  const dir = mkdtempSync(join(tmpdir(), 'cq-settings-'));
  try {
    for (const { name, fields } of commands) {
      const specs = settingSpecs(fields);
      const required = specs.filter((s) => s.required === true);
      const parse = (argv: readonly string[], env: NodeJS.ProcessEnv): Record<string, unknown> =>
        loadSettings<z.ZodType<Record<string, unknown>>>(`cellquota ${name}`, specs, fields, argv, env);
      const flagOf = (s: SettingSpec): string =>
        s.boolean === true ? `--${s.flag}` : `--${s.flag}=${s.example ?? ''}`;
      for (const s of specs) {
        assert.ok(
          s.example !== undefined && s.example !== s.defaultText,
          `${name} --${s.flag}: an example other than the default`,
        );
        const base = required.filter((r) => r !== s).map(flagOf);
        const key = Object.keys(fields.shape)[specs.indexOf(s)] ?? '';
        const file = join(dir, `${name}-${s.flag}.yaml`);
        writeFileSync(file, `${s.flag}: ${s.example ?? ''}\n`); // as an operator writes it: YAML types the value
        const byFlag = shown(parse([...base, flagOf(s)], {})[key]);
        const byEnv = shown(parse(base, { [settingVariable(s)]: s.example })[key]);
        const byFile = shown(parse([...base, '--config', file], {})[key]);
        assert.equal(byEnv, byFlag, `${name}: ${settingVariable(s)} and --${s.flag}`);
        assert.equal(byFile, byFlag, `${name}: '${s.flag}:' in a config file and --${s.flag}`);
        if (s.required !== true)
          assert.notEqual(
            byFlag,
            shown(parse(base, {})[key]),
            `${name} --${s.flag} ${s.example ?? ''} changes the setting from its default`,
          );
      }
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
