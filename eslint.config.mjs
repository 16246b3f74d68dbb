// Lint rules for the whole repository. Boundaries between the top-level components are enforced
// here: coordinator/ and cell-agent/ never import each other, shared/ imports neither, and the Raft
// core stays pure (no I/O, no wall clock, no ambient randomness). The tooling's folders (CONTRIBUTING.md
// "What may import what"): the product imports none of testkit/, test/, bench/, chaos/; testkit/
// imports none of test/, bench/, chaos/; bench/ and chaos/ never import test/; a file under test/
// imports no helper of another test folder (only its own folder's, and testkit/).
import js from '@eslint/js';
import tseslint from 'typescript-eslint';

const ioModules = ['node:net', 'node:fs', 'node:fs/promises', 'node:timers', 'node:timers/promises',
  'node:http', 'node:http2', 'node:dgram', 'node:child_process', 'node:worker_threads',
  'net', 'fs', 'timers', 'http', 'http2', 'child_process', 'classic-level', '@grpc/grpc-js'];

const tooling = { group: ['**/testkit/**', '**/test/**', '**/bench/**', '**/chaos/**'], message: 'the product imports no test tooling (testkit/, test/, bench/, chaos/)' };
/** Relative imports from a file `depth` folders below test/ that stay inside test/ but leave the file's folder. */
const otherTestFolder = (depth) => ({ regex: `^(\\.\\./){1,${depth}}(?!\\.\\.)`, message: 'a test imports no other test folder\'s helpers: what tests share lives in testkit/' });

export default tseslint.config(
  { ignores: ['dist/**', 'node_modules/**', 'bench/results/**', '.cellquota/**'] },
  js.configs.recommended,
  ...tseslint.configs.recommendedTypeChecked,
  {
    languageOptions: {
      parserOptions: { projectService: { allowDefaultProject: ['*.mjs', 'scripts/*.mjs', 'bin/*.mjs'] }, tsconfigRootDir: import.meta.dirname },
    },
    rules: {
      '@typescript-eslint/no-floating-promises': 'error',
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_', varsIgnorePattern: '^_' }],
      '@typescript-eslint/consistent-type-imports': 'error',
      '@typescript-eslint/restrict-template-expressions': ['error', { allowNumber: true, allowBoolean: true, allowNullish: true }],
      'no-constant-condition': ['error', { checkLoops: false }],
    },
  },
  {
    files: ['**/*.mjs'],
    ...tseslint.configs.disableTypeChecked,
    languageOptions: { globals: { process: 'readonly', console: 'readonly', URL: 'readonly' } },
  },
  {
    // The live view's browser script (served as is, no build step).
    files: ['coordinator/api/ui/**/*.js'],
    ...tseslint.configs.disableTypeChecked,
    languageOptions: {
      ...tseslint.configs.disableTypeChecked.languageOptions,
      sourceType: 'script',
      globals: Object.fromEntries(['window', 'document', 'location', 'history', 'fetch', 'URLSearchParams', 'AbortController', 'setTimeout', 'clearTimeout', 'setInterval', 'uPlot'].map((g) => [g, 'readonly'])),
    },
  },
  {
    // No line of the product code is over 120 characters (prettier's printWidth), comments and string
    // literals included: prettier cannot split a long string, so this keeps them split by hand.
    // Core max-len is deprecated (ESLint Stylistic's @stylistic/max-len takes the same options).
    files: ['{coordinator,cell-agent,cli,shared,embedded}/**/*.ts'],
    rules: {
      'max-len': ['error', {
        code: 120, tabWidth: 2, ignoreComments: false, ignoreTrailingComments: false, ignoreUrls: false,
        ignoreStrings: false, ignoreTemplateLiterals: false, ignoreRegExpLiterals: false,
      }],
    },
  },
  {
    files: ['cli/**/*.ts', 'embedded/**/*.ts'],
    rules: { 'no-restricted-imports': ['error', { patterns: [tooling] }] },
  },
  {
    files: ['coordinator/**/*.ts'],
    rules: { 'no-restricted-imports': ['error', { patterns: [{ group: ['**/cell-agent/**'], message: 'coordinator/ must not import cell-agent/' }, tooling] }] },
  },
  {
    files: ['cell-agent/**/*.ts'],
    rules: { 'no-restricted-imports': ['error', { patterns: [{ group: ['**/coordinator/**'], message: 'cell-agent/ must not import coordinator/' }, tooling] }] },
  },
  {
    files: ['shared/**/*.ts'],
    rules: { 'no-restricted-imports': ['error', { patterns: [{ group: ['**/coordinator/**', '**/cell-agent/**'], message: 'shared/ imports neither coordinator/ nor cell-agent/' }, tooling] }] },
  },
  {
    files: ['testkit/**/*.ts'],
    rules: { 'no-restricted-imports': ['error', { patterns: [{ group: ['**/test/**', '**/bench/**', '**/chaos/**'], message: 'testkit/ imports none of test/, bench/, chaos/' }] }] },
  },
  {
    files: ['bench/**/*.ts', 'chaos/**/*.ts'],
    rules: { 'no-restricted-imports': ['error', { patterns: [{ group: ['**/test/**'], message: 'bench/ and chaos/ never import test/: what they share with the tests lives in testkit/' }] }] },
  },
  { files: ['test/*/*.ts'], rules: { 'no-restricted-imports': ['error', { patterns: [otherTestFolder(1)] }] } },
  { files: ['test/*/*/*.ts'], rules: { 'no-restricted-imports': ['error', { patterns: [otherTestFolder(2)] }] } },
  { files: ['test/*/*/*/*.ts'], rules: { 'no-restricted-imports': ['error', { patterns: [otherTestFolder(3)] }] } },
  {
    files: ['coordinator/raft/**/*.ts'],
    rules: {
      'no-restricted-imports': ['error', {
        paths: ioModules.map((name) => ({ name, message: 'the Raft core is pure: I/O lives at the edges' })),
        patterns: [{ group: ['**/cell-agent/**', '../storage/**', '../transport/**'], message: 'the Raft core is pure' }],
      }],
      'no-restricted-properties': ['error',
        { object: 'Date', property: 'now', message: 'the Raft core counts time in ticks' },
        { object: 'Math', property: 'random', message: 'the Raft core takes randomness as an input' },
        { object: 'performance', property: 'now', message: 'the Raft core counts time in ticks' }],
      'no-restricted-globals': ['error', 'setTimeout', 'setInterval', 'setImmediate', 'queueMicrotask', 'process', 'fetch'],
      'no-restricted-syntax': ['error', { selector: 'NewExpression[callee.name="Date"]', message: 'the Raft core counts time in ticks' }],
    },
  },
);
