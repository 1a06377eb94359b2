import { describe, expect, it } from '@jest/globals';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { PassThrough } from 'node:stream';
import { createLogger, redactText } from './logger.js';

function collect(): { stream: PassThrough; lines: () => string[] } {
  const stream = new PassThrough();
  let text = '';
  stream.on('data', (c: Buffer) => (text += c.toString()));
  return { stream, lines: () => text.split('\n').filter(Boolean) };
}

describe('createLogger', () => {
  it('writes JSON lines with level, time, component, message and the fields of the line and of child loggers', async () => {
    const out = collect();
    const log = createLogger({ component: 'test', outputs: [{ destination: { stream: out.stream } }] });
    log.debug('not written at info');
    log.child({ image: 'img', uuid: 'u1' }).warn('attempt failed', { disk: 'd1' });
    log.error('gone');
    await log.close();
    const lines = out.lines().map((l) => JSON.parse(l) as Record<string, unknown>);
    expect(lines).toHaveLength(2);
    expect(lines[0]).toMatchObject({ level: 'warn', component: 'test', image: 'img', uuid: 'u1', disk: 'd1', msg: 'attempt failed' });
    expect(new Date(lines[0]!['time'] as string).toISOString()).toBe(lines[0]!['time']);
    expect(lines[1]).toMatchObject({ level: 'error', msg: 'gone' });
  });

  it('keeps a file as JSON while a second output is pretty, each with its own level', async () => {
    const dir = await mkdtemp(path.join(tmpdir(), 'logging-'));
    try {
      const term = collect();
      const file = path.join(dir, 'logs', 'x.log');
      const log = createLogger({
        component: 'cm',
        level: 'debug',
        outputs: [
          { destination: { file }, level: 'info' },
          { destination: { stream: term.stream }, format: 'pretty', level: 'warn', colorize: false },
        ],
      });
      log.debug('dbg');
      log.info('hello', { image: 'img' });
      log.warn('careful', { image: 'img', disk: 'd' });
      await log.close();
      const fileLines = (await readFile(file, 'utf8')).split('\n').filter(Boolean).map((l) => JSON.parse(l) as Record<string, unknown>);
      expect(fileLines.map((l) => [l['level'], l['msg']])).toEqual([
        ['info', 'hello'],
        ['warn', 'careful'],
      ]);
      const t = term.lines().join('\n');
      expect(t).toMatch(/^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}\] WARN: cm: careful$/m);
      expect(t).toContain('image: "img"');
      expect(t).not.toContain('hello');
      expect(() => JSON.parse(term.lines()[0]!)).toThrow();
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it('redacts secrets in fields and in message text', async () => {
    const out = collect();
    const log = createLogger({ component: 'test', outputs: [{ destination: { stream: out.stream } }] });
    log.info('GET https://u:hunter22@example.test/a?X-Amz-Signature=abc123&x=1 with Bearer tok.en-0123456789abcdef', { token: 'sekret', creds: { AWS_SECRET_ACCESS_KEY: 'k' } });
    await log.close();
    const line = out.lines()[0]!;
    expect(line).not.toContain('hunter22');
    expect(line).not.toContain('abc123');
    expect(line).not.toContain('tok.en');
    expect(redactText('refused /v1/file: missing bearer token')).toBe('refused /v1/file: missing bearer token');
    expect(line).not.toContain('sekret');
    expect(JSON.parse(line)).toMatchObject({ token: '***', creds: { AWS_SECRET_ACCESS_KEY: '***' } });
    expect(redactText('s3://bucket@region/path')).toBe('s3://bucket@region/path');
  });
});
