#!/usr/bin/env node
// Writes the CustomResourceDefinition manifests of the chart from the schema model in @bis/crd-types.
//   node tools/generators/crds.mjs           write charts/backing-image-system/crds/<kind>.yaml
//   node tools/generators/crds.mjs --check   exit 1 if the committed files differ from a fresh rendering
// It imports the built library (libs/crd-types/dist); `npx nx run @bis/crd-types:generate` builds it first.
import { mkdirSync, readFileSync, readdirSync, rmSync, writeFileSync, existsSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { renderCrdManifests } from '@bis/crd-types';

const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
const outDir = join(repoRoot, 'charts/backing-image-system/crds');
const check = process.argv.includes('--check');

const manifests = renderCrdManifests();
const present = existsSync(outDir) ? readdirSync(outDir).filter((f) => f.endsWith('.yaml')) : [];
const problems = [];
for (const [file, text] of manifests) {
  const path = join(outDir, file);
  const current = existsSync(path) ? readFileSync(path, 'utf8') : undefined;
  if (current === text) continue;
  if (check) problems.push(current === undefined ? `missing ${file}` : `outdated ${file}`);
  else {
    mkdirSync(outDir, { recursive: true });
    writeFileSync(path, text);
    console.log(`wrote ${join('charts/backing-image-system/crds', file)}`);
  }
}
for (const file of present) {
  if (manifests.has(file)) continue;
  if (check) problems.push(`stale ${file}`);
  else {
    rmSync(join(outDir, file));
    console.log(`removed ${join('charts/backing-image-system/crds', file)}`);
  }
}
if (problems.length > 0) {
  console.error(`CRD manifests are not up to date (${problems.join(', ')}); run: npx nx run @bis/crd-types:generate`);
  process.exit(1);
}
if (check) console.log(`${manifests.size} CRD manifests up to date`);
