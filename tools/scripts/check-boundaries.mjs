#!/usr/bin/env node
// Module-boundary check (part of `npm test`):
//  - libs never import apps;
//  - a project imports another project only through its package name, never by a relative path out of itself;
//  - every imported workspace package is declared in the importer's package.json dependencies (a spec, a file
//    under test-support/ or test/ may also use devDependencies);
//  - the project dependency graph has no cycles.
import { readdirSync, readFileSync, statSync, existsSync } from 'node:fs';
import { join, resolve, relative, dirname } from 'node:path';

const root = resolve(dirname(new URL(import.meta.url).pathname), '../..');
const projects = new Map(); // package name -> { dir, kind, deps }
for (const kind of ['libs', 'apps']) {
  const base = join(root, kind);
  if (!existsSync(base)) continue;
  for (const d of readdirSync(base)) {
    const pj = join(base, d, 'package.json');
    if (!existsSync(pj)) continue;
    const pkg = JSON.parse(readFileSync(pj, 'utf8'));
    projects.set(pkg.name, {
      dir: join(base, d),
      kind,
      deps: new Set(Object.keys(pkg.dependencies ?? {})),
      devDeps: new Set(Object.keys(pkg.devDependencies ?? {})),
      uses: new Set(),
    });
  }
}

function* sourceFiles(dir) {
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    if (['node_modules', 'dist', 'out-tsc', 'build'].includes(e.name)) continue;
    const p = join(dir, e.name);
    if (e.isDirectory()) yield* sourceFiles(p);
    else if (/\.(ts|tsx|mts|js|mjs)$/.test(e.name) && !e.name.endsWith('.d.ts')) yield p;
  }
}

const importRe = /(?:^|[\s;])(?:import|export)\s(?:[^'"]*?\sfrom\s)?['"]([^'"]+)['"]|import\(\s*['"]([^'"]+)['"]\s*\)/g;
const errors = [];
for (const [name, p] of projects) {
  for (const sub of ['src', 'bin', 'test']) {
    const dir = join(p.dir, sub);
    if (!existsSync(dir) || !statSync(dir).isDirectory()) continue;
    for (const file of sourceFiles(dir)) {
      const text = readFileSync(file, 'utf8');
      for (const m of text.matchAll(importRe)) {
        const spec = m[1] ?? m[2];
        const where = relative(root, file);
        if (spec.startsWith('.')) {
          const target = resolve(dirname(file), spec);
          if (!target.startsWith(p.dir + '/')) errors.push(`${where}: relative import "${spec}" leaves project ${name}`);
          continue;
        }
        const pkgName = spec.startsWith('@') ? spec.split('/').slice(0, 2).join('/') : spec.split('/')[0];
        const dep = projects.get(pkgName);
        if (!dep || pkgName === name) continue;
        if (p.kind === 'libs' && dep.kind === 'apps') errors.push(`${where}: library ${name} imports app ${pkgName}`);
        const testOnly = /\.(spec|test)\.[cm]?[jt]sx?$/.test(file) || /\/(test-support|test)\//.test(relative(p.dir, file));
        if (!p.deps.has(pkgName) && !(testOnly && p.devDeps.has(pkgName))) {
          errors.push(
            p.devDeps.has(pkgName)
              ? `${where}: ${name} imports ${pkgName} outside its tests but declares it only in devDependencies`
              : `${where}: ${name} imports ${pkgName} but does not declare it in package.json dependencies`,
          );
        }
        p.uses.add(pkgName);
      }
    }
  }
}

// Cycle detection over declared (dependencies and devDependencies) + used edges.
const state = new Map();
const stack = [];
function visit(n) {
  state.set(n, 1);
  stack.push(n);
  const p = projects.get(n);
  for (const m of new Set([...p.uses, ...[...p.deps, ...p.devDeps].filter((d) => projects.has(d))])) {
    if (state.get(m) === 1) errors.push(`import cycle: ${[...stack.slice(stack.indexOf(m)), m].join(' -> ')}`);
    else if (!state.has(m)) visit(m);
  }
  stack.pop();
  state.set(n, 2);
}
for (const n of projects.keys()) if (!state.has(n)) visit(n);

if (errors.length) {
  console.error(`module boundaries: ${errors.length} violation(s)`);
  for (const e of errors) console.error('  ' + e);
  process.exit(1);
}
console.log(`module boundaries: ${projects.size} projects, no violations`);
