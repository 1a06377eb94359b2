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
    const project = relative(process.env.BIS_WORKSPACE_ROOT ?? process.cwd(), this.rootDir) || '.';
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
