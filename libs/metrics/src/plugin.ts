import type { FastifyInstance, FastifyPluginAsync } from 'fastify';
import type { BackingImageMetrics } from './metrics.js';

export interface MetricsPluginOptions {
  metrics: BackingImageMetrics;
}

/** `GET /metrics` in the Prometheus text format. */
export const metricsPlugin: FastifyPluginAsync<MetricsPluginOptions> = async (app: FastifyInstance, opts) => {
  app.get('/metrics', async (_req, reply) => {
    const text = await opts.metrics.text();
    return reply.type(opts.metrics.contentType).send(text);
  });
};
