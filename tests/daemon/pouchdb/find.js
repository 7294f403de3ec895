// Runs find requests through pouchdb-find on an in-memory PouchDB, for
// tests/daemon/test_find_pouchdb.py: reads {"docs", "queries"} (JSON) from the file
// named by argv[2]; prints one answer per query, {"docs": [...]} or {"error": text}.
// A query with "index" first declares that pouchdb-find index (a sort needs one).
'use strict';
const fs = require('fs');
const PouchDB = require('pouchdb');
PouchDB.plugin(require('pouchdb-adapter-memory'));
PouchDB.plugin(require('pouchdb-find'));

async function main() {
  const input = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
  const db = new PouchDB('oracle', {adapter: 'memory'});
  await db.bulkDocs(input.docs);
  const out = [];
  for (const q of input.queries) {
    try {
      if (q.index) {
        await db.createIndex({index: {fields: q.index}});
      }
      const res = await db.find(q.request);
      out.push({docs: res.docs});
    } catch (e) {
      out.push({error: String(e && (e.message || e.error) || e)});
    }
  }
  process.stdout.write(JSON.stringify(out));
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
