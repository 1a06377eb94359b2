/**
 * JSON encoding that matches Go's `encoding/json` (`json.Marshal`) byte for byte for the value shapes used by
 * Longhorn's backupstore configs: HTML-safe escaping, short escapes for \b \f \n \r \t (Go >= 1.22), lowercase
 * `\u00XX` for other control characters, U+2028/U+2029 escaped, invalid UTF-16 (lone surrogates) written as U+FFFD.
 */

const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/g;

/** A JSON string literal exactly as Go's json.Marshal writes it. */
export function goJsonString(value: string): string {
  const wellFormed = value.replace(LONE_SURROGATE, '\uFFFD');
  // JSON.stringify already uses \b \f \n \r \t and lowercase \u00XX for the other C0 controls, like Go >= 1.22.
  return JSON.stringify(wellFormed).replace(/[<>&\u2028\u2029]/g, (c) => {
    return '\\u' + c.charCodeAt(0).toString(16).padStart(4, '0');
  });
}

/** A `map[string]string`: keys sorted by byte value; `null` for an absent map, `{}` for an empty one. */
export function goJsonStringMap(map: Readonly<Record<string, string>> | null | undefined): string {
  if (map === null || map === undefined) return 'null';
  const keys = Object.keys(map).sort(compareUtf8);
  return '{' + keys.map((k) => goJsonString(k) + ':' + goJsonString(map[k] ?? '')).join(',') + '}';
}

/** Byte-wise (UTF-8) order, which is how Go sorts map keys. */
export function compareUtf8(a: string, b: string): number {
  return Buffer.compare(Buffer.from(a, 'utf8'), Buffer.from(b, 'utf8'));
}

/** Go's `json.MarshalIndent(v, "", "\t")` for plain JSON values that were produced by the compact encoder. */
export function goIndentTabs(compact: string): string {
  // Re-indenting a compact document whose strings are already Go-escaped: walk it token-wise, respecting strings.
  let out = '';
  let depth = 0;
  let inString = false;
  for (let i = 0; i < compact.length; i++) {
    const c = compact[i] as string;
    if (inString) {
      out += c;
      if (c === '\\') {
        out += compact[i + 1] ?? '';
        i++;
      } else if (c === '"') inString = false;
      continue;
    }
    switch (c) {
      case '"':
        inString = true;
        out += c;
        break;
      case '{':
      case '[': {
        const close = c === '{' ? '}' : ']';
        if (compact[i + 1] === close) {
          out += c + close;
          i++;
        } else {
          depth++;
          out += c + '\n' + '\t'.repeat(depth);
        }
        break;
      }
      case '}':
      case ']':
        depth--;
        out += '\n' + '\t'.repeat(depth) + c;
        break;
      case ',':
        out += ',\n' + '\t'.repeat(depth);
        break;
      case ':':
        out += ': ';
        break;
      default:
        out += c;
    }
  }
  return out;
}
