// Import circles between folders of the product code: a folder's modules import another folder's,
// which (directly or through others) import the first folder's again. Each folder is a node (the
// files directly in it); an import of a file in another folder is an edge; every strongly connected
// component of more than one folder is a circle, printed with one import per edge as its evidence.
//   node scripts/folder-cycles.mjs [folders...]     (default: the product folders; exit 1 on a circle)
import { readFileSync, readdirSync, statSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import ts from 'typescript';

const PRODUCT = ['coordinator', 'cell-agent', 'cli', 'shared', 'embedded'];
const root = process.cwd();
const folders = process.argv.slice(2);

function* tsFiles(dir) {
  for (const name of readdirSync(dir)) {
    const path = join(dir, name);
    if (statSync(path).isDirectory()) yield* tsFiles(path);
    else if (name.endsWith('.ts') && !name.endsWith('.d.ts')) yield path;
  }
}

/** folder → (folder it imports → one example "file → import"). */
const edges = new Map();
for (const top of folders.length > 0 ? folders : PRODUCT) {
  for (const file of tsFiles(join(root, top))) {
    const from = relative(root, dirname(file));
    if (!edges.has(from)) edges.set(from, new Map());
    const { importedFiles } = ts.preProcessFile(readFileSync(file, 'utf8'), true, true);
    for (const { fileName } of importedFiles) {
      if (!fileName.startsWith('.')) continue;
      const to = relative(root, dirname(resolve(dirname(file), fileName)));
      if (to === from) continue;
      const out = edges.get(from);
      if (!out.has(to)) out.set(to, `${relative(root, file)} → ${fileName}`);
    }
  }
}

// Tarjan's strongly connected components.
let counter = 0;
const index = new Map();
const low = new Map();
const stack = [];
const onStack = new Set();
const components = [];
const connect = (v) => {
  index.set(v, counter);
  low.set(v, counter++);
  stack.push(v);
  onStack.add(v);
  for (const w of edges.get(v)?.keys() ?? []) {
    if (!index.has(w)) {
      connect(w);
      low.set(v, Math.min(low.get(v), low.get(w)));
    } else if (onStack.has(w)) low.set(v, Math.min(low.get(v), index.get(w)));
  }
  if (low.get(v) === index.get(v)) {
    const component = [];
    let w;
    do {
      w = stack.pop();
      onStack.delete(w);
      component.push(w);
    } while (w !== v);
    if (component.length > 1) components.push(component.sort());
  }
};
for (const v of edges.keys()) if (!index.has(v)) connect(v);

if (components.length === 0) {
  console.log(
    `folder-cycles: no import circle between the ${edges.size} folders of ${(folders.length > 0 ? folders : PRODUCT).join(', ')}`,
  );
} else {
  for (const component of components) {
    console.log(`folder circle: ${component.join(' ↔ ')}`);
    const members = new Set(component);
    for (const from of component) {
      for (const [to, example] of edges.get(from) ?? [])
        if (members.has(to)) console.log(`  ${from}/ → ${to}/   e.g. ${example}`);
    }
  }
  process.exitCode = 1;
}
