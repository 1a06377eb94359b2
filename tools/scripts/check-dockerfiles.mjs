#!/usr/bin/env node
// Checks the Dockerfiles of the repository against the files a build produces (run it after `npm run build`):
//   - every COPY/ADD source from the build context exists in the repository;
//   - every COPY --from=<stage> source exists in the repository at the path the stage's WORKDIR maps it to (the
//     build stage copies the repository to its WORKDIR and builds there), and each app whose files the final image
//     takes is among the projects the build stage builds (`nx run-many -t build -p …`);
//   - every `ln -s <target>` of the final stage points at a file the image has, and the default CMD is in exec form,
//     starts one of those commands and does not only print a help text.
//   node tools/scripts/check-dockerfiles.mjs [--root <dir>] [Dockerfile...]   (default: every apps/*/Dockerfile)
// Prints one line per problem and exits 1 when there is any; prints a summary and exits 0 otherwise.
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';

/** Dockerfile instructions: continuation lines joined, comments and blank lines dropped. */
export function parseDockerfile(text) {
  const out = [];
  let pending = '';
  let startLine = 0;
  const lines = text.split('\n');
  for (let i = 0; i < lines.length; i++) {
    const raw = lines[i].replace(/\r$/, '');
    if (!pending && /^\s*(#|$)/.test(raw)) continue;
    if (pending && /^\s*#/.test(raw)) continue; // comment lines inside a continued instruction
    if (!pending) startLine = i + 1;
    if (/\\\s*$/.test(raw)) {
      pending += raw.replace(/\\\s*$/, ' ');
      continue;
    }
    const full = (pending + raw).trim();
    pending = '';
    const m = /^(\S+)\s*(.*)$/s.exec(full);
    if (m) out.push({ line: startLine, op: m[1].toUpperCase(), args: m[2].trim() });
  }
  if (pending.trim()) {
    const m = /^(\S+)\s*(.*)$/s.exec(pending.trim());
    if (m) out.push({ line: startLine, op: m[1].toUpperCase(), args: m[2].trim() });
  }
  return out;
}

/** The arguments of COPY/ADD: flags (`--from=build`) and paths, JSON form included. */
function copyArgs(args) {
  const flags = {};
  let rest = args;
  for (;;) {
    const m = /^--([a-z-]+)(?:=(\S+))?\s+/.exec(rest);
    if (!m) break;
    flags[m[1]] = m[2] ?? true;
    rest = rest.slice(m[0].length);
  }
  let parts;
  if (rest.startsWith('[')) parts = JSON.parse(rest);
  else parts = rest.split(/\s+/).filter(Boolean);
  return { flags, sources: parts.slice(0, -1), dest: parts[parts.length - 1] };
}

const posixJoin = (a, b) => (b.startsWith('/') ? path.posix.normalize(b) : path.posix.normalize(path.posix.join(a, b)));

/** The stages of a Dockerfile with their WORKDIR, their copies and RUN lines. */
function stagesOf(instructions) {
  const stages = [];
  let cur;
  for (const ins of instructions) {
    if (ins.op === 'FROM') {
      const m = /^(?:--\S+\s+)*(\S+)(?:\s+AS\s+(\S+))?/i.exec(ins.args);
      cur = { name: m?.[2] ?? String(stages.length), base: m?.[1] ?? '', workdir: '/', copies: [], runs: [], cmd: undefined, line: ins.line };
      stages.push(cur);
      continue;
    }
    if (!cur) continue;
    if (ins.op === 'WORKDIR') cur.workdir = posixJoin(cur.workdir, ins.args);
    else if (ins.op === 'COPY' || ins.op === 'ADD') {
      const c = copyArgs(ins.args);
      cur.copies.push({ ...c, dest: posixJoin(cur.workdir, c.dest), destRaw: c.dest, line: ins.line, workdir: cur.workdir });
    } else if (ins.op === 'RUN') cur.runs.push({ text: ins.args, line: ins.line });
    else if (ins.op === 'CMD') cur.cmd = { text: ins.args, line: ins.line };
  }
  return stages;
}

/** The projects a build stage builds: the `-p`/`--projects` list of `nx run-many -t build`. */
function builtProjects(stage) {
  const out = new Set();
  for (const r of stage.runs) {
    for (const cmd of r.text.split(/&&|;/)) {
      if (!/\bnx\s+run-many\b/.test(cmd) || !/-t\s+build\b|--target[= ]build\b/.test(cmd)) continue;
      const m = /(?:^|\s)(?:-p|--projects)[= ](.+)$/.exec(cmd.trim());
      if (!m) {
        out.add('*'); // every project
        continue;
      }
      for (const p of m[1].split(/[\s,]+/)) {
        if (!p || p.startsWith('-')) break;
        out.add(p);
      }
    }
  }
  return out;
}

/** Checks one Dockerfile; returns a list of problems (empty when fine) and what was checked. */
export function checkDockerfile(file, root) {
  const rel = path.relative(root, file);
  const problems = [];
  const checked = [];
  const stages = stagesOf(parseDockerfile(readFileSync(file, 'utf8')));
  if (stages.length === 0) return { problems: [`${rel}: no FROM`], checked };
  const byName = new Map(stages.map((s) => [s.name, s]));
  /** The repository path a path inside a build stage comes from: the stage copied the context to its WORKDIR. */
  const repoPathIn = (stage, p) => {
    for (const c of stage.copies) {
      if (c.flags.from) continue;
      for (const src of c.sources) {
        const srcNorm = path.posix.normalize(src).replace(/\/$/, '');
        // `COPY libs ./libs` maps <workdir>/libs/... to libs/...; `COPY a b c ./` maps <workdir>/a to a.
        const destDir = c.sources.length > 1 || c.destRaw.endsWith('/') ? posixJoin(c.dest, path.posix.basename(srcNorm)) : c.dest;
        if (p === destDir || p.startsWith(destDir + '/')) return path.posix.join(srcNorm === '.' ? '' : srcNorm, p.slice(destDir.length));
      }
    }
    if (p === stage.workdir || p.startsWith(stage.workdir + '/')) return p.slice(stage.workdir.length + 1) || '.';
    return undefined;
  };
  for (const stage of stages) {
    for (const c of stage.copies) {
      for (const src of c.sources) {
        if (!c.flags.from) {
          if (/[*?[]/.test(src)) continue; // a glob: checked by docker itself
          checked.push(`${rel}:${c.line} ${src}`);
          if (!existsSync(path.join(root, src))) problems.push(`${rel}:${c.line}: COPY ${src}: no such file in the build context (${path.join(root, src)})`);
          continue;
        }
        const from = byName.get(String(c.flags.from));
        if (!from) continue; // an external image: nothing to check here
        const repoPath = repoPathIn(from, path.posix.normalize(src));
        if (repoPath === undefined) {
          problems.push(`${rel}:${c.line}: COPY --from=${c.flags.from} ${src}: not under the stage's WORKDIR ${from.workdir} nor a copied path`);
          continue;
        }
        checked.push(`${rel}:${c.line} ${src} -> ${repoPath}`);
        if (!existsSync(path.join(root, repoPath))) {
          problems.push(`${rel}:${c.line}: COPY --from=${c.flags.from} ${src}: ${repoPath} does not exist after the build (run: npm run build)`);
        }
        const app = /^apps\/([^/]+)/.exec(repoPath)?.[1];
        // A whole app directory is only useful with its build output: apps whose package points into dist/ need it.
        if (app && repoPath === `apps/${app}`) {
          const pkg = path.join(root, repoPath, 'package.json');
          if (existsSync(pkg) && readFileSync(pkg, 'utf8').includes('./dist/') && !existsSync(path.join(root, repoPath, 'dist'))) {
            problems.push(`${rel}:${c.line}: COPY --from=${c.flags.from} ${src}: ${repoPath}/dist does not exist after the build (run: npm run build)`);
          }
        }
        const built = builtProjects(from);
        if (app && !built.has('*') && !built.has(app)) {
          problems.push(`${rel}:${c.line}: COPY --from=${c.flags.from} ${src}: stage ${from.name} does not build project ${app} (nx run-many -t build -p ${[...built].join(' ')})`);
        }
      }
    }
  }
  // The final stage: the commands it links onto PATH must exist in the image, and the default CMD must run one.
  const final = stages[stages.length - 1];
  const imagePathToRepo = (p) => {
    for (const c of final.copies) {
      if (c.sources.length !== 1) continue;
      if (p === c.dest || p.startsWith(c.dest + '/')) {
        const src = path.posix.normalize(c.sources[0]);
        const rest = p.slice(c.dest.length);
        if (!c.flags.from) return path.posix.join(src, rest);
        const from = byName.get(String(c.flags.from));
        return from ? repoPathIn(from, path.posix.join(src, rest)) : undefined;
      }
    }
    return undefined;
  };
  const commands = new Set();
  for (const r of final.runs) {
    for (const m of r.text.matchAll(/\bln\s+-s\s+(\S+)\s+(\S+)/g)) {
      const target = m[1];
      const link = m[2];
      const repoPath = imagePathToRepo(target);
      checked.push(`${rel}:${r.line} ln -s ${target}`);
      if (repoPath === undefined) problems.push(`${rel}:${r.line}: ln -s ${target}: the image has no file there (not copied by the final stage)`);
      else if (!existsSync(path.join(root, repoPath))) problems.push(`${rel}:${r.line}: ln -s ${target}: ${repoPath} does not exist`);
      commands.add(path.posix.basename(link));
    }
  }
  if (!final.cmd) problems.push(`${rel}: the final stage has no CMD`);
  else {
    let cmd;
    try {
      cmd = JSON.parse(final.cmd.text);
    } catch {
      problems.push(`${rel}:${final.cmd.line}: CMD is not in exec form (a JSON array)`);
    }
    if (cmd) {
      if (!Array.isArray(cmd) || cmd.length === 0 || !cmd.every((a) => typeof a === 'string')) problems.push(`${rel}:${final.cmd.line}: CMD must be a non-empty array of strings`);
      else {
        if (!commands.has(cmd[0])) problems.push(`${rel}:${final.cmd.line}: CMD runs ${cmd[0]}, which the image does not install (ln -s … /usr/local/bin/${cmd[0]})`);
        if (cmd.includes('--help') || cmd.includes('-h')) problems.push(`${rel}:${final.cmd.line}: CMD only prints a help text: ${cmd.join(' ')}`);
        checked.push(`${rel}:${final.cmd.line} CMD ${cmd.join(' ')}`);
      }
    }
  }
  return { problems, checked, cmd: final.cmd ? (() => { try { return JSON.parse(final.cmd.text); } catch { return undefined; } })() : undefined };
}

function main(argv) {
  let root = path.resolve(import.meta.dirname, '../..');
  const files = [];
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === '--root') root = path.resolve(argv[++i]);
    else files.push(path.resolve(argv[i]));
  }
  if (files.length === 0) {
    for (const app of readdirSync(path.join(root, 'apps')).sort()) {
      const f = path.join(root, 'apps', app, 'Dockerfile');
      if (existsSync(f)) files.push(f);
    }
  }
  let problems = 0;
  let checked = 0;
  for (const f of files) {
    const r = checkDockerfile(f, root);
    for (const p of r.problems) console.error(p);
    problems += r.problems.length;
    checked += r.checked.length;
  }
  if (problems > 0) {
    console.error(`${problems} problem(s) in ${files.length} Dockerfile(s)`);
    return 1;
  }
  console.log(`${files.length} Dockerfile(s), ${checked} paths and commands checked: ok`);
  return 0;
}

if (process.argv[1] && path.resolve(process.argv[1]) === path.resolve(import.meta.filename)) process.exit(main(process.argv.slice(2)));
