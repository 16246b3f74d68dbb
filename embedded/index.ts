// `cellquota`: the embedded limiter, framework-free. The fastify plugin is `cellquota/fastify`, the
// express middleware `cellquota/express` (embedded/README.md).
export { createLimiter, LimiterInputError, MAX_HITS } from './limiter.js';
export type { CheckInput, Descriptor, LimitDecision, Limiter, LimiterStatus, PolicyStatus } from './limiter.js';
export { DEFAULT_EMBEDDED_TABLE_CAPACITY, LimiterOptionsError } from './options.js';
export type { LimiterLogger, LimiterOptions, RulesDocument } from './options.js';
export { rateLimitHeaders } from './http-gate.js';
export type { HeaderMode, HttpOptions } from './http-gate.js';
