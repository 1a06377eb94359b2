import { describe, it, expect } from '@jest/globals';
import { table, yaml } from './output.js';

describe('output', () => {
  it('aligns table columns under upper-case headers', () => {
    expect(table(['name', 'size'], [['a', '1 B'], ['longer', '2.00 KiB']])).toBe('NAME     SIZE\na        1 B\nlonger   2.00 KiB\n');
  });

  it('writes YAML that keeps strings as strings', () => {
    expect(yaml({ a: 'plain', b: 'true', c: '123', d: '', e: 'x: y', f: null, g: 3, h: [], i: {}, j: ['k', { l: 'm', n: [1] }] })).toBe(
      'a: plain\nb: "true"\nc: "123"\nd: ""\ne: "x: y"\nf: null\ng: 3\nh: []\ni: {}\nj:\n- k\n- l: m\n  "n":\n  - 1\n',
    );
    expect(yaml([])).toBe('[]\n');
  });
});
