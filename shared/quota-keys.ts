// The names of global quotas, as the coordinator's ledger and the agents both use them: `tenant/<id>`
// (the tenant's quota: its tier's rate and burst or its overrides), `tier/<name>` (the optional
// aggregate cap over all tenants of a tier) and `domain/<name>` (the optional domain-wide cap). `/`
// is not a name character, so keys are unambiguous. The agent keeps one bucket per key per cell.
export type QuotaKind = 'tenant' | 'tier' | 'domain';
export type QuotaKey = `${QuotaKind}/${string}`;

export function tenantKey(id: string): QuotaKey {
  return `tenant/${id}`;
}
export function tierCapKey(tier: string): QuotaKey {
  return `tier/${tier}`;
}
export function domainCapKey(domain: string): QuotaKey {
  return `domain/${domain}`;
}
