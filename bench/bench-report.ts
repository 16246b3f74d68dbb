// The shape every benchmark returns, and the writer of bench/results/ (JSON and markdown).
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import os from 'node:os';

export interface BenchReport {
  readonly name: string;
  readonly title: string;
  readonly rows: readonly Record<string, number | string>[];
  readonly notes: readonly string[];
}

export function machineLine(): string {
  const cpu = os.cpus()[0]?.model ?? 'unknown cpu';
  return `${os.cpus().length} × ${cpu}, ${Math.round(os.totalmem() / 2 ** 30)} GiB, Node ${process.version}`;
}

export function toMarkdown(reports: readonly BenchReport[], command: string): string {
  const lines = [`# Benchmark results`, '', `Command: \`${command}\``, '', `Machine: ${machineLine()}`, ''];
  for (const r of reports) {
    lines.push(`## ${r.title}`, '');
    const cols = [...new Set(r.rows.flatMap((row) => Object.keys(row)))];
    lines.push(`| ${cols.join(' | ')} |`, `| ${cols.map(() => '---').join(' | ')} |`);
    for (const row of r.rows) lines.push(`| ${cols.map((c) => String(row[c] ?? '')).join(' | ')} |`);
    lines.push('');
    for (const n of r.notes) lines.push(`- ${n}`);
    lines.push('');
  }
  return lines.join('\n');
}

export function writeResults(
  dir: string,
  reports: readonly BenchReport[],
  command: string,
): { json: string; md: string } {
  mkdirSync(dir, { recursive: true });
  const stamp = new Date().toISOString().replace(/[:.]/g, '-');
  const json = join(dir, `bench-${stamp}.json`);
  const md = join(dir, `bench-${stamp}.md`);
  writeFileSync(json, JSON.stringify({ machine: machineLine(), command, reports }, null, 2));
  writeFileSync(md, toMarkdown(reports, command));
  return { json, md };
}
