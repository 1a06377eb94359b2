import { stringify } from 'yaml';

/**
 * A renderer for the subset of Go templates (text/template + the Helm/sprig functions below) that the chart
 * `charts/backing-image-system` uses, so the chart can be rendered and checked where no `helm` binary exists.
 * Supported: `{{ }}` with `{{-`/`-}}` trimming, comments, `if`/`else if`/`else`/`end`, `range $v := x` and
 * `range $k, $v := x` (maps in sorted key order, like Go), `define`/`include`, variables (`$`, `$x`), field chains
 * (`.Values.a.b`, `$.Release.Name`), parenthesised pipelines, and the functions listed in FUNCS.
 * Anything else is an error naming the construct, so the chart cannot silently use more than this renderer checks.
 */

type Value = unknown;
type Node =
  | { t: 'text'; s: string }
  | { t: 'out'; expr: string }
  | { t: 'if'; branches: { cond: string; body: Node[] }[]; otherwise: Node[] }
  | { t: 'range'; keyVar?: string; valVar?: string; expr: string; body: Node[] }
  | { t: 'define'; name: string; body: Node[] };

export class TemplateError extends Error {
  constructor(template: string, why: string) {
    super(`template ${template}: ${why}`);
    this.name = 'TemplateError';
  }
}

interface Action {
  text: string;
  action?: string;
}

function lex(src: string): Action[] {
  const out: Action[] = [];
  const re = /\{\{(-?)(\s*)([\s\S]*?)(\s*)(-?)\}\}/g;
  let last = 0;
  let trimNext = false;
  for (let m = re.exec(src); m; m = re.exec(src)) {
    let text = src.slice(last, m.index);
    if (trimNext) text = text.replace(/^\s+/, '');
    if (m[1] === '-') text = text.replace(/\s+$/, '');
    out.push({ text });
    trimNext = m[5] === '-';
    const body = m[3];
    if (!body.startsWith('/*')) out.push({ text: '', action: body });
    last = re.lastIndex;
  }
  let tail = src.slice(last);
  if (trimNext) tail = tail.replace(/^\s+/, '');
  out.push({ text: tail });
  return out;
}

function parse(name: string, src: string): Node[] {
  const items = lex(src);
  let i = 0;
  const block = (ends: string[]): { nodes: Node[]; end: string } => {
    const nodes: Node[] = [];
    while (i < items.length) {
      const it = items[i++];
      if (it.action === undefined) {
        if (it.text) nodes.push({ t: 'text', s: it.text });
        continue;
      }
      const a = it.action.trim();
      const word = a.split(/\s+/)[0];
      if (ends.includes(word)) return { nodes, end: a };
      if (word === 'if') {
        const branches: { cond: string; body: Node[] }[] = [];
        let cond = a.slice(2).trim();
        let otherwise: Node[] = [];
        for (;;) {
          const r = block(['else', 'end']);
          branches.push({ cond, body: r.nodes });
          if (r.end === 'end') break;
          const rest = r.end.slice(4).trim();
          if (rest.startsWith('if ')) {
            cond = rest.slice(3).trim();
            continue;
          }
          const r2 = block(['end']);
          otherwise = r2.nodes;
          break;
        }
        nodes.push({ t: 'if', branches, otherwise });
      } else if (word === 'range') {
        const m = /^range\s+(?:(\$\w+)\s*(?:,\s*(\$\w+))?\s*:=\s*)?([\s\S]+)$/.exec(a);
        if (!m) throw new TemplateError(name, `cannot parse "${a}"`);
        const r = block(['end']);
        nodes.push(m[2] ? { t: 'range', keyVar: m[1], valVar: m[2], expr: m[3], body: r.nodes } : { t: 'range', valVar: m[1], expr: m[3], body: r.nodes });
      } else if (word === 'define') {
        const m = /^define\s+"([^"]+)"$/.exec(a);
        if (!m) throw new TemplateError(name, `cannot parse "${a}"`);
        nodes.push({ t: 'define', name: m[1], body: block(['end']).nodes });
      } else if (['with', 'template', 'block', 'else', 'end', 'break', 'continue'].includes(word)) {
        throw new TemplateError(name, `"${word}" is not supported by this renderer (or is misplaced)`);
      } else nodes.push({ t: 'out', expr: a });
    }
    if (ends.length) throw new TemplateError(name, `missing {{ end }}`);
    return { nodes, end: '' };
  };
  return block([]).nodes;
}

type Tok = { k: 'str' | 'num' | 'field' | 'var' | 'ident' | 'pipe' | 'lp' | 'rp'; v: string };

function tokenize(name: string, expr: string): Tok[] {
  const toks: Tok[] = [];
  const re = /\s*(?:("(?:[^"\\]|\\.)*")|(-?\d+(?:\.\d+)?)|(\$\w*(?:\.\w+)*)|(\.\w+(?:\.\w+)*|\.)|([A-Za-z_]\w*)|(\|)|(\()|(\)))/y;
  let pos = 0;
  while (pos < expr.length) {
    if (/^\s*$/.test(expr.slice(pos))) break;
    re.lastIndex = pos;
    const m = re.exec(expr);
    if (!m) throw new TemplateError(name, `cannot parse "${expr}" at "${expr.slice(pos)}"`);
    pos = re.lastIndex;
    if (m[1]) toks.push({ k: 'str', v: JSON.parse(m[1]) as string });
    else if (m[2]) toks.push({ k: 'num', v: m[2] });
    else if (m[3]) toks.push({ k: 'var', v: m[3] });
    else if (m[4]) toks.push({ k: 'field', v: m[4] });
    else if (m[5]) toks.push({ k: 'ident', v: m[5] });
    else if (m[6]) toks.push({ k: 'pipe', v: '|' });
    else if (m[7]) toks.push({ k: 'lp', v: '(' });
    else toks.push({ k: 'rp', v: ')' });
  }
  return toks;
}

export function truthy(v: Value): boolean {
  if (v === undefined || v === null || v === false || v === 0 || v === '') return false;
  if (Array.isArray(v)) return v.length > 0;
  if (typeof v === 'object') return Object.keys(v as object).length > 0;
  return true;
}

function toYaml(v: Value): string {
  if (v === undefined || v === null) return 'null';
  return stringify(v, { lineWidth: 0 }).replace(/\n$/, '');
}

function indent(n: number, s: string): string {
  const pad = ' '.repeat(n);
  return s
    .split('\n')
    .map((l) => pad + l)
    .join('\n');
}

function kindOf(v: Value): string {
  if (v === undefined || v === null) return 'invalid';
  if (Array.isArray(v)) return 'slice';
  if (typeof v === 'object') return 'map';
  if (typeof v === 'number') return Number.isInteger(v) ? 'int' : 'float64';
  if (typeof v === 'boolean') return 'bool';
  return 'string';
}

/** The functions the chart may use (Go builtins, Helm and sprig semantics). */
const FUNCS: Record<string, (...a: Value[]) => Value> = {
  quote: (v) => JSON.stringify(v === undefined || v === null ? '' : String(v)),
  toYaml: (v) => toYaml(v),
  toJson: (v) => JSON.stringify(v ?? null),
  indent: (n, s) => indent(Number(n), String(s ?? '')),
  nindent: (n, s) => '\n' + indent(Number(n), String(s ?? '')),
  default: (d, v) => (truthy(v) ? v : d),
  not: (v) => !truthy(v),
  and: (...a) => a.reduce((x, y) => (truthy(x) ? y : x)),
  or: (...a) => a.reduce((x, y) => (truthy(x) ? x : y)),
  eq: (a, b) => a === b,
  ne: (a, b) => a !== b,
  empty: (v) => !truthy(v),
  kindIs: (k, v) => kindOf(v) === k,
  printf: (f, ...a) => {
    let i = 0;
    return String(f).replace(/%[sdv]/g, () => String(a[i++] ?? ''));
  },
  kebabcase: (s) =>
    String(s)
      .replace(/([a-z0-9])([A-Z])/g, '$1-$2')
      .replace(/([A-Z])([A-Z][a-z])/g, '$1-$2')
      .toLowerCase(),
  trunc: (n, s) => String(s).slice(0, Number(n)),
  trimSuffix: (suf, s) => (String(s).endsWith(String(suf)) ? String(s).slice(0, -String(suf).length) : String(s)),
  replace: (a, b, s) => String(s).split(String(a)).join(String(b)),
  join: (sep, l) => (Array.isArray(l) ? l.map((x) => String(x ?? '')).join(String(sep)) : String(l ?? '')),
};

interface Scope {
  dot: Value;
  vars: Map<string, Value>;
}

export class ChartTemplates {
  private readonly defines = new Map<string, Node[]>();
  private readonly parsed = new Map<string, Node[]>();

  /** Adds a template file; `define`s in any file are visible to all (like Helm). */
  add(name: string, src: string): void {
    const nodes = parse(name, src);
    for (const n of nodes) if (n.t === 'define') this.defines.set(n.name, n.body);
    this.parsed.set(name, nodes);
  }

  render(name: string, root: Value): string {
    const nodes = this.parsed.get(name);
    if (!nodes) throw new TemplateError(name, 'no such template');
    return this.exec(name, nodes, { dot: root, vars: new Map([['$', root]]) });
  }

  private exec(name: string, nodes: Node[], scope: Scope): string {
    let out = '';
    for (const n of nodes) {
      switch (n.t) {
        case 'text':
          out += n.s;
          break;
        case 'define':
          break;
        case 'out': {
          const v = this.evalPipeline(name, tokenize(name, n.expr), scope);
          out += v === undefined || v === null ? '' : typeof v === 'object' ? JSON.stringify(v) : String(v);
          break;
        }
        case 'if': {
          const b = n.branches.find((br) => truthy(this.evalPipeline(name, tokenize(name, br.cond), scope)));
          out += this.exec(name, b ? b.body : n.otherwise, scope);
          break;
        }
        case 'range': {
          const coll = this.evalPipeline(name, tokenize(name, n.expr), scope);
          const entries: [Value, Value][] = Array.isArray(coll)
            ? coll.map((v, i) => [i, v])
            : coll && typeof coll === 'object'
              ? Object.keys(coll as object)
                  .sort()
                  .map((k) => [k, (coll as Record<string, Value>)[k]])
              : [];
          for (const [k, v] of entries) {
            const vars = new Map(scope.vars);
            if (n.keyVar) vars.set(n.keyVar, k);
            if (n.valVar) vars.set(n.valVar, v);
            out += this.exec(name, n.body, { dot: v, vars });
          }
          break;
        }
      }
    }
    return out;
  }

  private evalPipeline(name: string, toks: Tok[], scope: Scope): Value {
    const cmds: Tok[][] = [[]];
    let depth = 0;
    for (const t of toks) {
      if (t.k === 'lp') depth++;
      if (t.k === 'rp') depth--;
      if (t.k === 'pipe' && depth === 0) cmds.push([]);
      else cmds[cmds.length - 1].push(t);
    }
    let piped: Value;
    let hasPiped = false;
    for (const cmd of cmds) {
      if (cmd.length === 0) throw new TemplateError(name, 'empty command in pipeline');
      piped = this.evalCommand(name, cmd, scope, hasPiped ? [piped] : []);
      hasPiped = true;
    }
    return piped;
  }

  private evalCommand(name: string, cmd: Tok[], scope: Scope, extra: Value[]): Value {
    const args: Value[] = [];
    let i = 1;
    const operand = (): Value => {
      const t = cmd[i++];
      if (t.k === 'lp') {
        let depth = 1;
        const start = i;
        while (i < cmd.length && depth > 0) {
          if (cmd[i].k === 'lp') depth++;
          if (cmd[i].k === 'rp') depth--;
          i++;
        }
        return this.evalPipeline(name, cmd.slice(start, i - 1), scope);
      }
      return this.operandValue(name, t, scope);
    };
    const head = cmd[0];
    if (head.k === 'ident' && !['true', 'false', 'nil'].includes(head.v)) {
      while (i < cmd.length) args.push(operand());
      args.push(...extra);
      if (head.v === 'include') {
        const body = this.defines.get(String(args[0]));
        if (!body) throw new TemplateError(name, `include of undefined template "${String(args[0])}"`);
        return this.exec(name, body, { dot: args[1], vars: new Map([['$', args[1]]]) });
      }
      const f = FUNCS[head.v];
      if (!f) throw new TemplateError(name, `function "${head.v}" is not supported by this renderer`);
      return f(...args);
    }
    i = 0;
    const v = operand();
    if (i < cmd.length || extra.length) throw new TemplateError(name, `"${cmd.map((t) => t.v).join(' ')}" is not a function call`);
    return v;
  }

  private operandValue(name: string, t: Tok, scope: Scope): Value {
    switch (t.k) {
      case 'str':
        return t.v;
      case 'num':
        return Number(t.v);
      case 'ident':
        if (t.v === 'true') return true;
        if (t.v === 'false') return false;
        if (t.v === 'nil') return null;
        return FUNCS[t.v] ? FUNCS[t.v]() : (() => {
          throw new TemplateError(name, `unknown identifier "${t.v}"`);
        })();
      case 'field':
        return t.v === '.' ? scope.dot : walk(scope.dot, t.v.slice(1).split('.'));
      case 'var': {
        const [v, ...path] = t.v.split('.');
        if (!scope.vars.has(v)) throw new TemplateError(name, `undefined variable ${v}`);
        return walk(scope.vars.get(v), path);
      }
      default:
        throw new TemplateError(name, `unexpected "${t.v}"`);
    }
  }
}

function walk(v: Value, path: string[]): Value {
  let cur = v;
  for (const p of path) {
    if (cur === undefined || cur === null || typeof cur !== 'object') return undefined;
    cur = (cur as Record<string, Value>)[p];
  }
  return cur;
}
