import { AppsV1Api, type KubeConfig } from '@kubernetes/client-node';
import { ApiAccess } from './api-access.js';
import { withApiMessage } from './status-errors.js';

/** The label of Longhorn's manager DaemonSet and pods (its chart and its deploy manifest). */
export const LONGHORN_MANAGER_SELECTOR = 'app=longhorn-manager';

/** A Longhorn installation found in the cluster: its manager DaemonSet. */
export interface LonghornInstallation {
  namespace: string;
  name: string;
}

/**
 * Thrown when Longhorn's controllers run in the cluster. Both systems act on the same `longhorn.io` objects and
 * CustomResourceDefinitions: running both would have two controllers fight over every BackingImage, its managers
 * and their pods (and this chart's CRDs would replace Longhorn's).
 */
export class LonghornDetectedError extends Error {
  constructor(readonly found: readonly LonghornInstallation[]) {
    super(
      `Longhorn is installed in this cluster (DaemonSet ${found.map((f) => `${f.namespace}/${f.name}`).join(', ')} labelled ${LONGHORN_MANAGER_SELECTOR}): ` +
        'the backing-image system replaces Longhorn\'s backing-image controllers and must not run beside them, since both act on the same ' +
        'longhorn.io objects. Uninstall one of the two (see docs/kubernetes.md, "Longhorn in the same cluster").',
    );
    this.name = 'LonghornDetectedError';
  }
}

/**
 * Longhorn's manager DaemonSets in every namespace (one cluster-scoped list of `apps/v1` DaemonSets by label, an API
 * unchanged since Kubernetes 1.9). Empty when there is none.
 */
export async function findLonghornManagers(kubeConfig: KubeConfig, access: ApiAccess = new ApiAccess()): Promise<LonghornInstallation[]> {
  access.require('apps', 'daemonsets', 'list');
  const apps = kubeConfig.makeApiClient(AppsV1Api);
  try {
    const list = await apps.listDaemonSetForAllNamespaces({ labelSelector: LONGHORN_MANAGER_SELECTOR });
    return list.items.map((d) => ({ namespace: d.metadata?.namespace ?? '', name: d.metadata?.name ?? '' }));
  } catch (err) {
    throw withApiMessage('list daemonsets.apps in all namespaces (to check that Longhorn is not installed; the chart\'s ClusterRole grants it)', err);
  }
}

/** Refuses (LonghornDetectedError) when Longhorn's manager runs in the cluster. */
export async function assertNoLonghorn(kubeConfig: KubeConfig, access?: ApiAccess): Promise<void> {
  const found = await findLonghornManagers(kubeConfig, access);
  if (found.length > 0) throw new LonghornDetectedError(found);
}
