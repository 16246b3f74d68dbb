#!/usr/bin/env node
// The cellquota command (built from cli/main.ts by `npm run build`, which `npm install` runs).
import "../dist/cli/main.js";
