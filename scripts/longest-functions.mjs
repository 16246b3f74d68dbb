// The longest functions in the product code, measured with the TypeScript compiler's parser: every
// function declaration, method, constructor, accessor, function expression and arrow function, its
// length in lines from its first to its last line (nested functions count inside their parent too).
//   node scripts/longest-functions.mjs [--top N] [folders...]    (default: the product folders)
import { readFileSync, readdirSync, statSync } from 'node:fs';
import { join, relative } from 'node:path';
import ts from 'typescript';

const PRODUCT = ['coordinator', 'cell-agent', 'cli', 'shared', 'embedded'];
const args = process.argv.slice(2);
let top = 10;
const folders = [];
for (let i = 0; i < args.length; i++) {
  if (args[i] === '--top') top = Number(args[++i]);
  else folders.push(args[i]);
}
const root = process.cwd();

function* tsFiles(dir) {
  for (const name of readdirSync(dir)) {
    const path = join(dir, name);
    if (statSync(path).isDirectory()) yield* tsFiles(path);
    else if (name.endsWith('.ts') && !name.endsWith('.d.ts')) yield path;
  }
}

function nameOf(node, source) {
  if (node.name !== undefined) return node.name.getText(source);
  const parent = node.parent;
  if (
    parent !== undefined &&
    (ts.isVariableDeclaration(parent) || ts.isPropertyAssignment(parent) || ts.isPropertyDeclaration(parent))
  ) {
    return parent.name.getText(source);
  }
  return '(anonymous)';
}

const found = [];
for (const folder of folders.length > 0 ? folders : PRODUCT) {
  for (const file of tsFiles(join(root, folder))) {
    const source = ts.createSourceFile(file, readFileSync(file, 'utf8'), ts.ScriptTarget.Latest, true);
    const visit = (node) => {
      if (ts.isFunctionLike(node) && 'body' in node && node.body !== undefined) {
        const first = source.getLineAndCharacterOfPosition(node.getStart(source)).line + 1;
        const last = source.getLineAndCharacterOfPosition(node.getEnd()).line + 1;
        found.push({
          lines: last - first + 1,
          where: `${relative(root, file)}:${first}-${last}`,
          name: nameOf(node, source),
        });
      }
      ts.forEachChild(node, visit);
    };
    visit(source);
  }
}
found.sort((a, b) => b.lines - a.lines);
for (const f of found.slice(0, top)) console.log(`${String(f.lines).padStart(5)}  ${f.name}  ${f.where}`);
