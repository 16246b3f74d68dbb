// The agent's `--tenants` file (the static table of tiers and tenants that quotas.ts enforces): its
// schema, reading and validation, and the --unknown-tenant policy's text form. Kept apart from
// quotas.ts so that the serving threads, which get the validated table in their init, never load
// zod or yaml (about 10 MiB resident per thread, bench/agent-idle-rss.ts).
import { readFile } from 'node:fs/promises';
import { parse as parseYaml } from 'yaml';
import { z } from 'zod';
import { QuotaConfigError } from './quotas.js';

const rateBurstSchema = z.strictObject({
  rate: z.number().finite().nonnegative(),
  burst: z.number().finite().nonnegative(),
});

const tierNameSchema = z
  .string()
  .min(1)
  .max(128)
  .regex(/^[A-Za-z0-9_.:-]+$/, 'letters, digits and _ . : -');

export const quotaFileSchema = z
  .strictObject({
    tiers: z
      .record(
        tierNameSchema,
        z.strictObject({
          rate: z.number().finite().nonnegative(),
          burst: z.number().finite().nonnegative(),
          cap: rateBurstSchema.optional(),
        }),
      )
      .default({}),
    tenants: z
      .record(
        z.string().min(1).max(1024),
        z.union([
          tierNameSchema,
          z.strictObject({
            tier: tierNameSchema,
            rate: z.number().finite().nonnegative().optional(),
            burst: z.number().finite().nonnegative().optional(),
          }),
        ]),
      )
      .default({}),
    domainCap: rateBurstSchema.optional(),
  })
  .superRefine((file, ctx) => {
    for (const [id, t] of Object.entries(file.tenants)) {
      const tier = typeof t === 'string' ? t : t.tier;
      if (!Object.hasOwn(file.tiers, tier))
        ctx.addIssue({ code: 'custom', path: ['tenants', id], message: `unknown tier '${tier}'` });
    }
  });

export type QuotaFile = z.output<typeof quotaFileSchema>;
export type RateBurst = z.output<typeof rateBurstSchema>;

export type UnknownTenantPolicy =
  { readonly kind: 'deny' } | { readonly kind: 'allow' } | { readonly kind: 'tier'; readonly tier: string };

/** 'deny' | 'allow' | 'tier:NAME' → a policy; null if the text is none of them. */
export function parseUnknownTenantPolicy(text: string): UnknownTenantPolicy | null {
  if (text === 'deny') return { kind: 'deny' };
  if (text === 'allow') return { kind: 'allow' };
  if (text.startsWith('tier:') && tierNameSchema.safeParse(text.slice(5)).success)
    return { kind: 'tier', tier: text.slice(5) };
  return null;
}

// Here for its callers; in quotas.ts, so that the agent's main thread formats it without zod.
export { formatUnknownTenantPolicy } from './quotas.js';

/** Reads and validates a tenants file (YAML or JSON). Throws QuotaConfigError. */
export async function loadQuotaFile(path: string): Promise<QuotaFile> {
  let text: string;
  try {
    text = await readFile(path, 'utf8');
  } catch (error) {
    throw new QuotaConfigError(
      `${path}: cannot read tenants file: ${error instanceof Error ? error.message : String(error)}`,
    );
  }
  let doc: unknown;
  try {
    doc = parseYaml(text);
  } catch (error) {
    throw new QuotaConfigError(`${path}: not valid YAML: ${error instanceof Error ? error.message : String(error)}`);
  }
  return parseQuotaFile(doc ?? {}, path);
}

/** Validates a parsed tenants document. Throws QuotaConfigError naming the field. */
export function parseQuotaFile(doc: unknown, source = 'tenants'): QuotaFile {
  const parsed = quotaFileSchema.safeParse(doc);
  if (parsed.success) return parsed.data;
  const lines = parsed.error.issues.map((i) => `  ${i.path.map(String).join('.') || '(root)'}: ${i.message}`);
  throw new QuotaConfigError(`${source}: invalid tenants file\n${lines.join('\n')}`);
}
