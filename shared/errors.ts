// The base of every error class in the product code. Its `code` is required and stable: callers,
// tests and logs match on the code, never on the message, and every code is listed in
// docs/errors.md (test/docs/error-codes.test.ts reads the codes from the classes' types and the
// table from the document, and compares them). A new error class extends CellquotaError with a
// literal `code` (or a union of literals), and gets a row in docs/errors.md.
export abstract class CellquotaError extends Error {
  /** The stable identifier of the error (docs/errors.md). */
  abstract readonly code: string;

  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = new.target.name;
  }
}
