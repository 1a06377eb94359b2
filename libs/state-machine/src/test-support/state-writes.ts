/**
 * The check behind "every state change goes through the state machine": it finds, with the TypeScript compiler's
 * type checker, every write to a field whose declared type is a state of `@bis/state-machine`, and reports those
 * whose value is not a call of the lib's `transition` function.
 *
 * A field is a *state field* when its declared type, without `undefined` and `null`, is a union of two or more string
 * literals that all belong to the states of one machine (file, manager, backup, backup progress). This finds the
 * fields of the CRD status types (`state`, `currentState`, whatever they are called) and of any other record typed
 * with a state, without a list of today's names.
 *
 * A *write* is:
 * - an assignment (`=`, `??=`, `||=`, `&&=`) to a property (`a.state = …`, `a['state'] = …`);
 * - a property of an object literal (`{ state: … }`, `{ ...s, state }`) whose target type — the literal's contextual
 *   type (an annotation, a parameter, `satisfies`, a map's value type), else its own type — has a state field of
 *   that name;
 * - a property of an object literal passed to `Object.assign(target, …)`, checked against the target's type.
 */
import path from 'node:path';
import ts from 'typescript';

export interface StateWriteViolation {
  file: string;
  line: number;
  column: number;
  field: string;
  text: string;
}

export interface StateWriteCheckOptions {
  /** The state sets of the machines (a field is a state field when its literals all fall in one of them). */
  stateSets: readonly (readonly string[])[];
  /** Where the `transition` function is declared (writes whose value is a call of it are legal). */
  transitionFile: string;
  /** Files allowed to write state fields directly (the state-machine lib itself). */
  isExempt?: (file: string) => boolean;
}

const ASSIGNMENT_OPERATORS = new Set<ts.SyntaxKind>([
  ts.SyntaxKind.EqualsToken,
  ts.SyntaxKind.QuestionQuestionEqualsToken,
  ts.SyntaxKind.BarBarEqualsToken,
  ts.SyntaxKind.AmpersandAmpersandEqualsToken,
]);

export const CHECK_COMPILER_OPTIONS: ts.CompilerOptions = {
  target: ts.ScriptTarget.ES2022,
  module: ts.ModuleKind.NodeNext,
  moduleResolution: ts.ModuleResolutionKind.NodeNext,
  customConditions: ['development'],
  lib: ['lib.es2023.d.ts', 'lib.dom.d.ts'],
  types: ['node'],
  jsx: ts.JsxEmit.ReactJSX,
  strict: true,
  skipLibCheck: true,
  noEmit: true,
  esModuleInterop: true,
  resolveJsonModule: true,
};

/** Checks the given source files of `program` and returns every direct write of a state field. */
export function findStateWrites(program: ts.Program, files: readonly string[], opts: StateWriteCheckOptions): StateWriteViolation[] {
  const checker = program.getTypeChecker();
  const sets = opts.stateSets.map((s) => new Set(s));
  const transitionFile = path.resolve(opts.transitionFile);
  const out: StateWriteViolation[] = [];

  const isStateType = (type: ts.Type): boolean => {
    const members = (type.isUnion() ? type.types : [type]).filter((t) => !(t.flags & (ts.TypeFlags.Undefined | ts.TypeFlags.Null)));
    if (members.length < 2 || !members.every((t) => t.isStringLiteral())) return false;
    const values = members.map((t) => (t as ts.StringLiteralType).value);
    return sets.some((s) => values.every((v) => s.has(v)));
  };

  const isStateProperty = (owner: ts.Type, name: string): boolean => {
    for (const t of owner.isUnion() ? owner.types : [owner]) {
      const p = checker.getPropertyOfType(checker.getApparentType(t), name);
      if (p && isStateType(checker.getTypeOfSymbol(p))) return true;
    }
    return false;
  };

  const isTransitionCall = (e: ts.Expression): boolean => {
    let x = e;
    while (ts.isParenthesizedExpression(x)) x = x.expression;
    if (!ts.isCallExpression(x)) return false;
    let sym = checker.getSymbolAtLocation(ts.isPropertyAccessExpression(x.expression) ? x.expression.name : x.expression);
    if (sym && sym.flags & ts.SymbolFlags.Alias) sym = checker.getAliasedSymbol(sym);
    const decl = sym?.declarations?.[0];
    return !!decl && sym!.name === 'transition' && path.resolve(decl.getSourceFile().fileName) === transitionFile;
  };

  for (const file of files) {
    const sf = program.getSourceFile(file);
    if (!sf || opts.isExempt?.(sf.fileName)) continue;
    const report = (node: ts.Node, field: string) => {
      const { line, character } = sf.getLineAndCharacterOfPosition(node.getStart(sf));
      out.push({ file: sf.fileName, line: line + 1, column: character + 1, field, text: node.getText(sf).split('\n')[0]!.slice(0, 160) });
    };
    const checkLiteral = (obj: ts.ObjectLiteralExpression, target: ts.Type | undefined) => {
      for (const p of obj.properties) {
        if (!ts.isPropertyAssignment(p) && !ts.isShorthandPropertyAssignment(p)) continue;
        const name = p.name.getText(sf).replace(/^['"]|['"]$/g, '');
        const value = ts.isPropertyAssignment(p) ? p.initializer : p.name;
        if (isTransitionCall(value)) continue;
        const owner = target ?? checker.getTypeAtLocation(obj);
        if (isStateProperty(owner, name)) report(p, name);
      }
    };
    const visit = (node: ts.Node): void => {
      if (ts.isBinaryExpression(node) && ASSIGNMENT_OPERATORS.has(node.operatorToken.kind)) {
        const left = node.left;
        let name: string | undefined;
        let owner: ts.Expression | undefined;
        if (ts.isPropertyAccessExpression(left)) {
          name = left.name.text;
          owner = left.expression;
        } else if (ts.isElementAccessExpression(left) && ts.isStringLiteralLike(left.argumentExpression)) {
          name = left.argumentExpression.text;
          owner = left.expression;
        }
        if (name && owner && !isTransitionCall(node.right) && isStateProperty(checker.getTypeAtLocation(owner), name)) report(node, name);
      }
      if (ts.isObjectLiteralExpression(node)) {
        const parent = node.parent;
        const assignCall =
          ts.isCallExpression(parent) && parent.arguments.indexOf(node) > 0 && parent.expression.getText(sf) === 'Object.assign' ? parent : undefined;
        checkLiteral(node, assignCall ? checker.getTypeAtLocation(assignCall.arguments[0]!) : checker.getContextualType(node));
      }
      ts.forEachChild(node, visit);
    };
    visit(sf);
  }
  return out;
}
