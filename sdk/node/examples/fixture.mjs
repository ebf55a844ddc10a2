#!/usr/bin/env node
// The fixture command of `handoff conformance` (--fixture-cmd and
// --leader-cmd) for a worker that serves the fixture's steps with
// serveFixture from @handoff-dev/worker/testing, such as examples/worker.mjs:
//
//   node fixture.mjs --dir DIR --worker 'node worker.mjs' STEP [ARG]
//
// restart starts a fresh worker, stop stops it, the other steps go to it.
import { fixtureMain } from '@handoff-dev/worker/testing';

process.exitCode = await fixtureMain(process.argv.slice(2));
