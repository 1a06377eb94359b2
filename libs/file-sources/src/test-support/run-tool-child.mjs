// A stand-in for a data source: runs one tool through the built runTool() and waits for it. Prints its pid first.
// argv: <path of dist/tool-process.js> <cmd> [args…]
const [distFile, cmd, ...args] = process.argv.slice(2);
const { runTool } = await import(distFile);
process.stdout.write(`${JSON.stringify({ pid: process.pid })}\n`);
await runTool(cmd, args, { packageName: 'coreutils' }).catch((e) => process.stderr.write(`${e.message}\n`));
