// Jest reporter: when BIS_TEST_SUMMARY_DIR is set, writes this project's totals there so that `npm test` can print
// one closing line for the whole workspace. Enabled by tools/scripts/test.mjs (`--reporters` passed to every project).
import { mkdirSync, writeFileSync } from 'node:fs';
import { join, relative } from 'node:path';

export default class SummaryReporter {
  constructor(globalConfig) {
    this.rootDir = globalConfig.rootDir;
  }

  onRunComplete(_contexts, results) {
    const dir = process.env.BIS_TEST_SUMMARY_DIR;
    if (!dir) return;
    mkdirSync(dir, { recursive: true });
    // The second run of `npm test` (BIS_TEST_PHASE=alone, jest.base.js) reports apart from the first.
    const alone = process.env.BIS_TEST_PHASE === 'alone';
    if (alone && results.numTotalTests === 0) return;
    const project = (relative(process.env.BIS_WORKSPACE_ROOT ?? process.cwd(), this.rootDir) || '.') + (alone ? ' (alone)' : '');
    const name = project.replace(/[^a-zA-Z0-9_.-]/g, '_');
    writeFileSync(
      join(dir, `${name}.json`),
      JSON.stringify({
        project,
        passed: results.numPassedTests,
        failed: results.numFailedTests,
        skipped: results.numPendingTests + results.numTodoTests,
        suitesFailed: results.numFailedTestSuites,
        runtimeErrorSuites: results.numRuntimeErrorTestSuites,
      }),
    );
  }
}
