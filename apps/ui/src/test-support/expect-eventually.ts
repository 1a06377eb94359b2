import { expect } from '@jest/globals';
import type { Locator } from 'playwright-core';

/**
 * Retries `check` (jest assertions) until it passes or `timeoutMs` passes; then it throws the last failure. The
 * default leaves room for a loaded machine (a 15 s default timed out at load 10 while the system was still working).
 */
export async function eventually(check: () => Promise<void>, timeoutMs = 30_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    try {
      await check();
      return;
    } catch (err) {
      if (Date.now() > deadline) throw err;
      await new Promise((r) => setTimeout(r, 100));
    }
  }
}

const text = async (loc: Locator): Promise<string> => ((await loc.count()) ? ((await loc.first().textContent()) ?? '').trim() : '<no element>');

export const expectText = (loc: Locator, want: string): Promise<void> => eventually(async () => expect(await text(loc)).toBe(want));
export const expectTextContaining = (loc: Locator, want: string): Promise<void> => eventually(async () => expect(await text(loc)).toContain(want));
export const expectCount = (loc: Locator, n: number): Promise<void> => eventually(async () => expect(await loc.count()).toBe(n));
export const expectAttr = (loc: Locator, name: string, re: RegExp): Promise<void> => eventually(async () => expect((await loc.count()) ? await loc.first().getAttribute(name) : '<no element>').toMatch(re));
export const expectVisible = (loc: Locator): Promise<void> => eventually(async () => expect(await loc.first().isVisible()).toBe(true));
export const expectDisabled = (loc: Locator): Promise<void> => eventually(async () => expect(await loc.first().isDisabled()).toBe(true));
