import { describe, expect, it } from '@jest/globals';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import ts from 'typescript';
import { BACKUP_MACHINE } from './backup-state.js';
import { FILE_MACHINE } from './file-state.js';
import { MANAGER_MACHINE } from './manager-state.js';
import { CHECK_COMPILER_OPTIONS, findStateWrites, type StateWriteViolation } from './test-support/state-writes.js';

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, '../../..');
const ownSrc = path.resolve(here);
const transitionFile = path.join(ownSrc, 'machine.ts');
/** Every machine of the code base: the check takes its state fields from their states. */
const stateSets = [FILE_MACHINE, MANAGER_MACHINE, BACKUP_MACHINE].map((m) => m.states);

/** Non-spec TypeScript sources of every project under libs/ and apps/ (test doubles in test-support/ excluded). */
function projectSources(): string[] {
  const out: string[] = [];
  const walk = (dir: string): void => {
    for (const e of fs.readdirSync(dir, { withFileTypes: true })) {
      if (e.name === 'node_modules' || e.name === 'dist' || e.name === 'test-support' || e.name.startsWith('.')) continue;
      const p = path.join(dir, e.name);
      if (e.isDirectory()) walk(p);
      else if (/\.tsx?$/.test(e.name) && !/\.(spec|test)\.tsx?$/.test(e.name) && !e.name.endsWith('.d.ts')) out.push(p);
    }
  };
  for (const top of ['libs', 'apps']) {
    for (const project of fs.readdirSync(path.join(root, top))) {
      const src = path.join(root, top, project, 'src');
      if (fs.existsSync(src)) walk(src);
    }
  }
  return out.sort();
}

const format = (v: StateWriteViolation) => `${path.relative(root, v.file)}:${v.line}:${v.column} ${v.field}: ${v.text}`;

describe('state fields are written only through transition()', () => {
  // One program over the whole repository: slow on a loaded machine.
  it('holds for every source file of libs/ and apps/', () => {
    const files = projectSources();
    expect(files.length).toBeGreaterThan(100);
    const program = ts.createProgram(files, CHECK_COMPILER_OPTIONS);
    const violations = findStateWrites(program, files, {
      stateSets,
      transitionFile,
      isExempt: (f) => path.resolve(f).startsWith(ownSrc + path.sep),
    });
    expect(violations.map(format)).toEqual([]);
  }, 600_000);

  describe('finds planted violations', () => {
    // A small in-memory source: a state type, a `transition` function, a status type, and code that writes it.
    const header = `
      type FileState = 'pending' | 'ready' | 'failed';
      function transition(machine: string, from: FileState, event: string): FileState { return from; }
      interface DiskFileStatus { state?: FileState; progress?: number }
      interface Status { currentState?: FileState; map?: Record<string, DiskFileStatus> }
      declare const status: Status;
      declare function update(s: { status: Status }): void;
    `;
    const check = (code: string): string[] => {
      const file = '/mem/code.ts';
      const host = ts.createCompilerHost(CHECK_COMPILER_OPTIONS);
      const base = { ...host };
      host.fileExists = (f) => f === file || base.fileExists(f);
      host.readFile = (f) => (f === file ? header + code : base.readFile(f));
      host.getSourceFile = (f, v, onError) => (f === file ? ts.createSourceFile(f, header + code, v, true) : base.getSourceFile(f, v, onError));
      const program = ts.createProgram([file], CHECK_COMPILER_OPTIONS, host);
      return findStateWrites(program, [file], { stateSets: [['pending', 'ready', 'failed']], transitionFile: file }).map((v) => `${v.field}: ${v.text}`);
    };

    it('an assignment to a state field', () => {
      expect(check(`${header}\nstatus.currentState = 'failed';`)).toEqual(["currentState: status.currentState = 'failed'"]);
    });
    it('a spread with a state property passed where a status is expected', () => {
      expect(check(`${header}\nupdate({ status: { ...status, currentState: 'ready' } });`)).toEqual(["currentState: currentState: 'ready'"]);
    });
    it('an entry of a map of statuses, and a shorthand property', () => {
      expect(check(`${header}\nconst state: FileState = 'ready';\nstatus.map!['d'] = { state, progress: 1 };`)).toEqual(['state: state']);
    });
    it('Object.assign onto a status, and ??=', () => {
      expect(check(`${header}\nObject.assign(status, { currentState: 'failed' as FileState });\nstatus.currentState ??= 'pending';`)).toEqual([
        "currentState: currentState: 'failed' as FileState",
        "currentState: status.currentState ??= 'pending'",
      ]);
    });
    it('a field with another name, found by its type', () => {
      expect(check(`${header}\ninterface Other { phase: FileState }\ndeclare const o: Other;\no.phase = status.currentState!;`)).toEqual(['phase: o.phase = status.currentState!']);
    });
    it('but not a write whose value is a transition, nor a field of another type', () => {
      expect(
        check(
          `${header}\nstatus.currentState = transition('file', status.currentState ?? 'pending', 'fail');\n` +
            `update({ status: { ...status, currentState: transition('file', 'pending', 'processed') } });\n` +
            `const plain: { state: string } = { state: 'x' };\nplain.state = 'ready';`,
        ),
      ).toEqual([]);
    });
  });
});
