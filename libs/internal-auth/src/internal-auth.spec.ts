import { describe, it, expect, afterAll } from '@jest/globals';
import { promises as fsp } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { bearerMatches, checkInternalCaller, ensureTokenFile, readTokenFile } from './internal-auth.js';

const dirs: string[] = [];
afterAll(async () => {
  for (const d of dirs) await fsp.rm(d, { recursive: true, force: true });
});
const tmp = async () => {
  const d = await fsp.mkdtemp(path.join(os.tmpdir(), 'internal-auth-'));
  dirs.push(d);
  return d;
};

describe('internal-auth', () => {
  it('creates the token file with mode 0600 once and reuses it; narrows a file readable by others', async () => {
    const file = path.join(await tmp(), 'sub', 'internal-token');
    const t1 = await ensureTokenFile(file);
    expect(t1).toMatch(/^[A-Za-z0-9_-]{43}$/);
    expect((await fsp.stat(file)).mode & 0o777).toBe(0o600);
    expect(await ensureTokenFile(file)).toBe(t1);
    await fsp.chmod(file, 0o644);
    expect(await ensureTokenFile(file)).toBe(t1);
    expect((await fsp.stat(file)).mode & 0o777).toBe(0o600);
  });

  it('refuses short tokens and tokens with white space inside', async () => {
    const d = await tmp();
    await fsp.writeFile(path.join(d, 'short'), 'abc\n');
    await expect(readTokenFile(path.join(d, 'short'))).rejects.toThrow('at least 16 characters');
    await fsp.writeFile(path.join(d, 'spaces'), 'abcdefgh ijklmnopqrs\n');
    await expect(readTokenFile(path.join(d, 'spaces'))).rejects.toThrow('white space');
  });

  it('matches only "Bearer <token>" exactly', () => {
    const token = 'the-right-token-0123456789';
    expect(bearerMatches(`Bearer ${token}`, token)).toBe(true);
    expect(bearerMatches(`bearer ${token}`, token)).toBe(true);
    expect(bearerMatches(`Bearer ${token}x`, token)).toBe(false);
    expect(bearerMatches(`Bearer ${token.slice(1)}`, token)).toBe(false);
    expect(bearerMatches(token, token)).toBe(false);
    expect(bearerMatches(`Basic ${token}`, token)).toBe(false);
    expect(bearerMatches([`Bearer ${token}`, `Bearer ${token}`], token)).toBe(false);
    expect(bearerMatches(undefined, token)).toBe(false);
    expect(bearerMatches('Bearer ', token)).toBe(false);
  });

  it('decides: no token configured admits all; the opt-in admits only callers that send nothing', () => {
    const token = 'the-right-token-0123456789';
    expect(checkInternalCaller(undefined, undefined)).toEqual({ ok: true });
    expect(checkInternalCaller({ token }, undefined)).toEqual({ ok: false, reason: 'missing bearer token (authorization header)' });
    expect(checkInternalCaller({ token }, 'Bearer nope')).toEqual({ ok: false, reason: 'invalid bearer token' });
    expect(checkInternalCaller({ token }, `Bearer ${token}`)).toEqual({ ok: true });
    expect(checkInternalCaller({ token, allowUnauthenticated: true }, undefined)).toEqual({ ok: true });
    expect(checkInternalCaller({ token, allowUnauthenticated: true }, [])).toEqual({ ok: true });
    expect(checkInternalCaller({ token, allowUnauthenticated: true }, 'Bearer nope')).toEqual({ ok: false, reason: 'invalid bearer token' });
  });
});
