// What every server under test is asked to enforce, in one place.
//
// Two domains, so one server process serves both variants of the benchmark:
//   bench          every tenant under one rule of 1e9 req/s: nothing is refused, the figures are
//                  those of the decision path
//   bench-limited  the same, except tenants whose number ends in an odd digit (500 of 1,000):
//                  1 request per hour each, so after its first request every second request is
//                  refused (~50 %), at any offered rate
// A request is domain + one descriptor [{key: 'tenant', value: 'tenant-N'}].

export const DOMAIN_UNLIMITED = 'bench';
/** bench/overload.ts: every tenant under a small rule, SMALL_PER_SECOND a second. */
export const DOMAIN_SMALL = 'bench-small';
export const SMALL_PER_SECOND = 50;
export const DOMAIN_LIMITED = 'bench-limited';
export const TENANT_KEY = 'tenant';
export const TENANTS = 1000;

/** The 1e9 req/s rule (fits requests_per_unit's uint32). */
export const UNLIMITED_PER_SECOND = 1_000_000_000;
/** The limited rule: 1 request per hour. */
export const LIMITED_PER_HOUR = 1;

const ODD_DIGITS = ['1', '3', '5', '7', '9'] as const;

/** True for a tenant the limited domain refuses (after its first request): value ends in an odd digit. */
export function isLimitedTenant(domain: string, value: string): boolean {
  if (domain !== DOMAIN_LIMITED) return false;
  const last = value.charCodeAt(value.length - 1);
  return last >= 48 && last <= 57 && (last & 1) === 1;
}

/** The same rules in envoyproxy/ratelimit's YAML (cell-agent/rules): one file per domain. */
export function rulesYaml(): { readonly file: string; readonly text: string }[] {
  const unlimited = `    rate_limit: {unit: second, requests_per_unit: ${UNLIMITED_PER_SECOND}}`;
  return [
    {
      file: `${DOMAIN_UNLIMITED}.yaml`,
      text: [`domain: ${DOMAIN_UNLIMITED}`, 'descriptors:', `  - key: ${TENANT_KEY}`, unlimited, ''].join('\n'),
    },
    {
      file: `${DOMAIN_SMALL}.yaml`,
      text: [
        `domain: ${DOMAIN_SMALL}`,
        'descriptors:',
        `  - key: ${TENANT_KEY}`,
        `    rate_limit: {unit: second, requests_per_unit: ${SMALL_PER_SECOND}}`,
        '',
      ].join('\n'),
    },
    {
      file: `${DOMAIN_LIMITED}.yaml`,
      text: [
        `domain: ${DOMAIN_LIMITED}`,
        'descriptors:',
        ...ODD_DIGITS.flatMap((d) => [
          `  - key: ${TENANT_KEY}`,
          `    value: "tenant-*${d}"`,
          `    rate_limit: {unit: hour, requests_per_unit: ${LIMITED_PER_HOUR}}`,
        ]),
        `  - key: ${TENANT_KEY}`,
        unlimited,
        '',
      ].join('\n'),
    },
  ];
}
