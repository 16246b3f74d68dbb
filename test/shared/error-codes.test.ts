// Every error class of the product code extends CellquotaError (shared/errors.ts), its `code` is a
// string literal (or a union of them), and docs/errors.md lists exactly those codes, each with the
// class that throws it. The codes are read from the classes' types with the TypeScript compiler,
// the same way a caller sees them, not from a list kept beside the code.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, readdirSync, statSync } from 'node:fs';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import ts from 'typescript';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const PRODUCT = ['coordinator', 'cell-agent', 'cli', 'shared', 'embedded'];

function tsFiles(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name);
    if (statSync(path).isDirectory()) return tsFiles(path);
    return name.endsWith('.ts') && !name.endsWith('.d.ts') ? [path] : [];
  });
}

interface ErrorClass {
  readonly name: string;
  readonly file: string;
  readonly extendsBase: boolean;
  /** The literal codes of its `code` property; null when the type is not made of string literals. */
  readonly codes: readonly string[] | null;
}

/** Every class in the product code whose base chain reaches Error, with its codes. */
function errorClasses(): ErrorClass[] {
  const files = PRODUCT.flatMap((f) => tsFiles(join(ROOT, f)));
  const program = ts.createProgram(files, {
    target: ts.ScriptTarget.ES2022,
    module: ts.ModuleKind.NodeNext,
    moduleResolution: ts.ModuleResolutionKind.NodeNext,
    strict: true,
    noEmit: true,
    skipLibCheck: true,
    types: ['node'],
  });
  const checker = program.getTypeChecker();
  const out: ErrorClass[] = [];
  for (const source of program.getSourceFiles()) {
    if (!files.includes(source.fileName)) continue;
    const visit = (node: ts.Node): void => {
      if (ts.isClassDeclaration(node) || ts.isClassExpression(node)) {
        const type = checker.getTypeAtLocation(node);
        const chain: string[] = [];
        for (let t: ts.Type | undefined = type; t !== undefined;) {
          const bases: ts.BaseType[] = t.isClassOrInterface() ? checker.getBaseTypes(t) : [];
          t = bases[0];
          if (t !== undefined) chain.push(t.getSymbol()?.getName() ?? '');
        }
        if (chain.includes('Error')) {
          const code = type.getProperty('code');
          const codeType = code === undefined ? undefined : checker.getTypeOfSymbolAtLocation(code, node);
          const parts = codeType === undefined ? [] : codeType.isUnion() ? codeType.types : [codeType];
          const literal = parts.length > 0 && parts.every((p) => p.isStringLiteral());
          out.push({
            name: node.name?.getText(source) ?? '(anonymous)',
            file: relative(ROOT, source.fileName),
            extendsBase: chain.includes('CellquotaError'),
            codes: literal ? parts.map((p) => p.value) : null,
          });
        }
      }
      ts.forEachChild(node, visit);
    };
    visit(source);
  }
  return out;
}

/** The tables of docs/errors.md: code → the classes named in its row. */
function documentedCodes(): Map<string, string[]> {
  const text = readFileSync(join(ROOT, 'docs/errors.md'), 'utf8');
  const rows = new Map<string, string[]>();
  for (const line of text.split('\n')) {
    const m = /^\| `([^`]+)` \| ([^|]+) \|/.exec(line);
    if (m === null) continue;
    const [, code, classes] = m as unknown as [string, string, string];
    assert.ok(!rows.has(code), `docs/errors.md lists ${code} twice`);
    rows.set(
      code,
      [...classes.matchAll(/`([^`]+)`/g)].map((c) => c[1] ?? ''),
    );
  }
  return rows;
}

void test('every error class extends CellquotaError with a literal code, and docs/errors.md lists exactly those codes', () => {
  const classes = errorClasses();
  assert.ok(classes.length >= 25, `found the error classes (${classes.length})`);
  for (const c of classes) {
    assert.ok(c.name === 'CellquotaError' || c.extendsBase, `${c.name} (${c.file}) extends CellquotaError`);
    if (c.name !== 'CellquotaError') assert.ok(c.codes !== null, `${c.name} (${c.file}) has a code of string literals`);
  }
  const inCode = new Map<string, string[]>();
  for (const c of classes) for (const code of c.codes ?? []) inCode.set(code, [...(inCode.get(code) ?? []), c.name]);
  const documented = documentedCodes();
  const undocumented = [...inCode.keys()].filter((code) => !documented.has(code));
  assert.deepEqual(undocumented, [], 'every code is documented in docs/errors.md');
  const stale = [...documented.keys()].filter((code) => !inCode.has(code));
  assert.deepEqual(stale, [], 'every code docs/errors.md lists is one the code has');
  for (const [code, classes] of documented) {
    assert.deepEqual(
      [...classes].sort(),
      [...new Set(inCode.get(code))].sort(),
      `the classes docs/errors.md names for ${code}`,
    );
  }
});
