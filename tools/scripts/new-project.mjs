#!/usr/bin/env node
// Scaffolds a workspace project (lib or app) with the repository's conventions:
//   node tools/scripts/new-project.mjs lib <name> [--deps a,b]   -> libs/<name>, package @bis/<name>
//   node tools/scripts/new-project.mjs app <name> [--deps a,b]   -> apps/<name>, package <name>, bin <name>
import { mkdirSync, writeFileSync, existsSync } from 'node:fs';
import { join } from 'node:path';

const [kind, name, ...rest] = process.argv.slice(2);
if (!['lib', 'app'].includes(kind) || !name) {
  console.error('usage: new-project.mjs lib|app <name> [--deps dep1,dep2]');
  process.exit(2);
}
const depsIdx = rest.indexOf('--deps');
const deps = depsIdx >= 0 ? rest[depsIdx + 1].split(',').filter(Boolean) : [];
const root = join(kind === 'lib' ? 'libs' : 'apps', name);
if (existsSync(root)) {
  console.error(`${root} already exists`);
  process.exit(1);
}
mkdirSync(join(root, 'src'), { recursive: true });
const pkgName = kind === 'lib' ? `@bis/${name}` : name;
const pkg = {
  name: pkgName,
  version: '0.1.0',
  private: true,
  type: 'module',
  exports: {
    '.': { development: './src/index.ts', types: './dist/index.d.ts', default: './dist/index.js' },
  },
  ...(kind === 'app' ? { bin: { [name]: './bin/' + name + '.js' } } : {}),
  dependencies: Object.fromEntries(deps.map((d) => [`@bis/${d}`, '*'])),
  nx: { tags: [kind === 'lib' ? 'type:lib' : 'type:app'] },
};
writeFileSync(join(root, 'package.json'), JSON.stringify(pkg, null, 2) + '\n');
const refs = deps.map((d) => ({ path: `../../libs/${d}/tsconfig.lib.json` }));
writeFileSync(
  join(root, 'tsconfig.json'),
  JSON.stringify({ extends: '../../tsconfig.base.json', files: [], include: [], references: [{ path: './tsconfig.lib.json' }, { path: './tsconfig.spec.json' }] }, null, 2) + '\n',
);
writeFileSync(
  join(root, 'tsconfig.lib.json'),
  JSON.stringify(
    {
      extends: '../../tsconfig.base.json',
      compilerOptions: { rootDir: 'src', outDir: 'dist', tsBuildInfoFile: 'dist/tsconfig.lib.tsbuildinfo' },
      include: ['src/**/*.ts'],
      exclude: ['src/**/*.spec.ts', 'src/**/test-support/**'],
      references: refs,
    },
    null,
    2,
  ) + '\n',
);
writeFileSync(
  join(root, 'tsconfig.spec.json'),
  JSON.stringify(
    {
      extends: '../../tsconfig.base.json',
      compilerOptions: { outDir: 'out-tsc/spec', tsBuildInfoFile: 'out-tsc/spec/tsconfig.spec.tsbuildinfo', types: ['node', 'jest'], noEmit: false, emitDeclarationOnly: true },
      include: ['src/**/*.spec.ts', 'src/**/test-support/**/*.ts', 'test/**/*.ts'],
      references: [{ path: './tsconfig.lib.json' }, ...refs],
    },
    null,
    2,
  ) + '\n',
);
writeFileSync(
  join(root, 'jest.config.js'),
  `import base from '../../jest.base.js';\n\nexport default { ...base, displayName: '${pkgName}' };\n`,
);
if (kind === 'app') {
  mkdirSync(join(root, 'bin'), { recursive: true });
  writeFileSync(
    join(root, 'bin', name + '.js'),
    `#!/usr/bin/env node\nimport '../dist/main.js';\n`,
    { mode: 0o755 },
  );
  writeFileSync(join(root, 'src', 'main.ts'), `export {};\n`);
}
writeFileSync(join(root, 'src', 'index.ts'), `export {};\n`);
console.log(`created ${root} (${pkgName})`);
