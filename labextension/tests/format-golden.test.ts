// formatBytes and formatDuration against the text the Python formatters write (jupyter_gpu.rendering.units), read from
// tests/fixtures/golden/format.json at the repo root. That file is made by tests/fixtures/golden_format.py and
// checked against units.py by tests/labextension/test_golden_format.py: no expected text is copied here.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import * as path from 'node:path';
import { test } from 'node:test';

import { formatBytes, formatDuration } from '../src/format';

// Compiled to labextension/build-test/tests/: the repository root is three levels up.
const GOLDEN = path.resolve(__dirname, '..', '..', '..', 'tests', 'fixtures', 'golden', 'format.json');

interface Case {
  input: number | null;
  text: string;
}

interface Golden {
  bytes: Case[];
  duration: Case[];
}

function golden(): Golden {
  const data = JSON.parse(readFileSync(GOLDEN, 'utf8')) as Golden;
  for (const key of ['bytes', 'duration'] as const) {
    assert.ok(Array.isArray(data[key]) && data[key].length >= 20, `${key}: the golden has its cases`);
    for (const c of data[key]) {
      assert.ok(c.input === null || typeof c.input === 'number', `${key}: ${JSON.stringify(c)}`);
      assert.equal(typeof c.text, 'string', `${key}: ${JSON.stringify(c)}`);
    }
  }
  return data;
}

/** Each case with the TypeScript text in place of the Python one: equal lists, or a diff of every mismatch. */
function rendered(cases: Case[], format: (value: number | null) => string): Case[] {
  return cases.map(c => ({ input: c.input, text: format(c.input) }));
}

test('formatBytes writes exactly what jupyter_gpu.rendering.units.format_bytes writes, for every golden case', () => {
  const cases = golden().bytes;
  assert.ok(cases.some(c => c.input === null), 'a missing reading is among the cases');
  assert.deepEqual(rendered(cases, formatBytes), cases);
});

test('formatDuration writes exactly what jupyter_gpu.rendering.units.format_duration writes, for every golden case', () => {
  const cases = golden().duration;
  assert.ok(cases.some(c => c.input === null), 'a missing reading is among the cases');
  assert.deepEqual(rendered(cases, formatDuration), cases);
});
