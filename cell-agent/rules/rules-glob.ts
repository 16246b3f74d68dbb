// The `*` glob of descriptor values. A config value containing `*` is a wildcard: each `*` matches
// zero or more characters, anywhere in the value (`foo*`, `*bar`, `bar*b`, `foo*bar*baz`, `*`); every
// other character matches itself. There is no other metacharacter and no escape, and patterns are
// never turned into regular expressions, so a user's value can neither inject regex syntax nor cause
// catastrophic backtracking.
//
// Algorithm: split the pattern at `*` into literal segments. The first must be a prefix of the
// subject and the last a suffix (not overlapping the prefix); the middle ones must occur in order in
// between. Taking the leftmost occurrence of each middle segment is always right: it leaves the
// largest possible rest for the segments after it. Cost O(subject length × pattern length) at worst,
// with no allocation per test.

export interface GlobMatcher {
  /** The pattern as written in the config, e.g. `foo*bar`. */
  readonly pattern: string;
  /** Whether the whole of `subject` matches the pattern. */
  readonly test: (subject: string) => boolean;
}

export function isGlobPattern(value: string): boolean {
  return value.includes('*');
}

export function compileGlob(pattern: string): GlobMatcher {
  const segments = pattern.split('*');
  const first = segments[0] ?? '';
  const last = segments[segments.length - 1] ?? '';
  let test: (subject: string) => boolean;
  if (segments.length === 1) {
    test = (subject) => subject === pattern;
  } else {
    const middle = Object.freeze(segments.slice(1, -1).filter((s) => s.length > 0));
    const minLength = first.length + last.length + middle.reduce((n, s) => n + s.length, 0);
    if (middle.length === 0) {
      // `foo*`, `*bar`, `foo*bar`, `*`, `**`: a prefix and a suffix that must not overlap.
      test = (subject) => subject.length >= minLength && subject.startsWith(first) && subject.endsWith(last);
    } else {
      test = (subject) => {
        if (subject.length < minLength || !subject.startsWith(first) || !subject.endsWith(last)) return false;
        const end = subject.length - last.length;
        let from = first.length;
        for (const segment of middle) {
          const at = subject.indexOf(segment, from);
          if (at < 0 || at + segment.length > end) return false;
          from = at + segment.length;
        }
        return true;
      };
    }
  }
  return Object.freeze({ pattern, test });
}
