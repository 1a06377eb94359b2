import { stringify } from 'yaml';
import { LONGHORN_GROUP, LONGHORN_VERSION } from './enums.js';
import { CHART_CRD_KINDS } from './kinds/index.js';
import type { KindDefinition, PrinterColumn } from './kinds/kind.js';
import { CRD_LABELS } from './names.js';
import { toOpenApi, type OpenApiSchema } from './schema/openapi.js';

/** An `apiextensions.k8s.io/v1` CustomResourceDefinition, as far as this project writes it. */
export interface CustomResourceDefinition {
  apiVersion: 'apiextensions.k8s.io/v1';
  kind: 'CustomResourceDefinition';
  metadata: { labels: Record<string, string>; name: string };
  spec: {
    group: string;
    names: { kind: string; listKind: string; plural: string; shortNames: string[]; singular: string };
    scope: 'Namespaced';
    versions: Array<{
      additionalPrinterColumns: PrinterColumn[];
      name: string;
      schema: { openAPIV3Schema: OpenApiSchema };
      served: boolean;
      storage: boolean;
      subresources: { status: Record<string, never> };
    }>;
  };
}

const API_VERSION_DESCRIPTION =
  'APIVersion is the versioned schema of this representation of an object. See https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#resources';
const KIND_DESCRIPTION =
  'Kind is the REST resource this object represents, in CamelCase. See https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds';

function sortedColumn(c: PrinterColumn): PrinterColumn {
  // Alphabetical keys, like controller-gen.
  const out: { description?: string; jsonPath: string; name: string; type: PrinterColumn['type'] } = {
    jsonPath: c.jsonPath,
    name: c.name,
    type: c.type,
  };
  return c.description === undefined ? out : { description: c.description, ...out };
}

/** The CRD object of one kind: group longhorn.io, only version v1beta2 (served + storage), status subresource. */
export function buildCustomResourceDefinition(def: KindDefinition): CustomResourceDefinition {
  const root = toOpenApi(def.root);
  const openAPIV3Schema: OpenApiSchema = {
    description: def.description,
    properties: {
      apiVersion: { description: API_VERSION_DESCRIPTION, type: 'string' },
      kind: { description: KIND_DESCRIPTION, type: 'string' },
      metadata: { type: 'object' },
      ...(root.properties ?? {}),
    },
    ...(root.required ? { required: root.required } : {}),
    type: 'object',
  };
  openAPIV3Schema.properties = Object.fromEntries(
    Object.keys(openAPIV3Schema.properties ?? {})
      .sort()
      .map((k) => [k, (openAPIV3Schema.properties ?? {})[k] as OpenApiSchema]),
  );
  return {
    apiVersion: 'apiextensions.k8s.io/v1',
    kind: 'CustomResourceDefinition',
    metadata: { labels: { ...CRD_LABELS }, name: `${def.plural}.${LONGHORN_GROUP}` },
    spec: {
      group: LONGHORN_GROUP,
      names: {
        kind: def.kind,
        listKind: def.listKind,
        plural: def.plural,
        shortNames: [...def.shortNames],
        singular: def.singular,
      },
      scope: 'Namespaced',
      versions: [
        {
          additionalPrinterColumns: def.printerColumns.map(sortedColumn),
          name: LONGHORN_VERSION,
          schema: { openAPIV3Schema },
          served: true,
          storage: true,
          subresources: { status: {} },
        },
      ],
    },
  };
}

/** Header of every generated manifest. */
export const CRD_FILE_HEADER = 'Generated from @bis/crd-types by tools/generators/crds.mjs. Do not edit: run `npx nx run @bis/crd-types:generate`.';

/** File name of a kind's manifest (renderCrdManifests): the lower-case singular, e.g. `backingimage.yaml`. */
export function crdFileName(def: KindDefinition): string {
  return `${def.singular}.yaml`;
}

/** Renders one CRD as YAML text (deterministic: fixed key order, no line folding). */
export function renderCrdYaml(def: KindDefinition): string {
  const body = stringify(buildCustomResourceDefinition(def), { lineWidth: 0, indentSeq: false, aliasDuplicateObjects: false });
  return `# ${CRD_FILE_HEADER}\n${body}`;
}

/** Every CRD manifest of the chart: file name → YAML text, in a stable order. */
export function renderCrdManifests(): Map<string, string> {
  return new Map(CHART_CRD_KINDS.map((def) => [crdFileName(def), renderCrdYaml(def)]));
}

/** Where the chart's CRDs live: a template, so that `helm upgrade` updates them (files under `crds/` are never upgraded). */
export const CRD_TEMPLATE_FILE = 'templates/crds.yaml';

/**
 * The chart template of every CRD: rendered when `crds.install` is true, each CRD annotated
 * `helm.sh/resource-policy: keep` when `crds.keep` is true (an uninstall then leaves the CRDs and every object).
 */
export function renderCrdTemplate(): string {
  const keep = '  {{- if .Values.crds.keep }}\n  annotations:\n    helm.sh/resource-policy: keep\n  {{- end }}\n';
  const docs = CHART_CRD_KINDS.map((def) => {
    const body = stringify(buildCustomResourceDefinition(def), { lineWidth: 0, indentSeq: false, aliasDuplicateObjects: false });
    if (body.includes('{{')) throw new Error(`the CRD of ${def.kind} contains "{{", which the chart template would interpret`);
    const at = body.indexOf('\nmetadata:\n');
    if (at < 0) throw new Error(`the CRD of ${def.kind} has no metadata`);
    const split = at + '\nmetadata:\n'.length;
    return `---\n${body.slice(0, split)}${keep}${body.slice(split)}`;
  });
  return `{{- /* ${CRD_FILE_HEADER} */ -}}\n{{- if .Values.crds.install }}\n${docs.join('')}{{- end }}\n`;
}
