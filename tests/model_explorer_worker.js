// Model Explorer's own web app code run on a graph JSON, in node (tests/test_model_explorer.py):
// 1. its JSON adapter's format check (the function of the main bundle that answers "Unsupported
//    JSON format"), as `model-explorer FILE.json` runs it in the browser;
// 2. its web worker's graph processing (namespaces into layers, edges, layout): event 0, what the
//    app posts when it opens a graph.
// Prints one JSON object: {"error": ...} or what the worker built. Exit 2: the bundle's shape is not
// the one this script knows (another package version), so the caller skips.
// usage: node model_explorer_worker.js MAIN_BUNDLE.js WORKER_BUNDLE.js GRAPH.json
const fs = require('fs');
const vm = require('vm');
const [mainPath, workerPath, graphPath] = process.argv.slice(2);

function unknown(why) { console.log(JSON.stringify({unknown: why})); process.exit(2); }

const main = fs.readFileSync(mainPath, 'utf8');
const marker = main.indexOf('"Unsupported JSON format"');
if (marker < 0) unknown('no JSON adapter in the main bundle');
const start = main.lastIndexOf('function ', marker);
const name = /^function ([\w$]+)\(/.exec(main.slice(start, start + 60));
if (!name) unknown('the JSON adapter is not a plain function');
let depth = 0, end = main.indexOf('{', start);
for (; end < main.length; end++) {
  if (main[end] === '{') depth++;
  else if (main[end] === '}' && --depth === 0) break;
}
const check = new Function(`${main.slice(start, end + 1)}\nreturn ${name[1]};`)();
const fileName = graphPath.split('/').pop();
const loaded = check(JSON.parse(fs.readFileSync(graphPath, 'utf8')), fileName);
if (loaded.error || !loaded.graphCollections) {
  console.log(JSON.stringify({error: loaded.error || 'no graph collection'}));
  process.exit(1);
}
const collection = loaded.graphCollections[0];
const graph = collection.graphs[0];

class OffscreenCanvas {  // the worker measures label widths; a fixed width per character is enough here
  getContext() { return {font: '', measureText: (text) => ({width: 7 * String(text).length})}; }
}
let handler = null;
const posted = [];
const sandbox = {OffscreenCanvas, navigator: {userAgent: 'node'}, console, setTimeout, clearTimeout, performance,
  TextEncoder, TextDecoder, addEventListener: (type, fn) => { if (type === 'message') handler = fn; },
  postMessage: (message) => posted.push(message)};
sandbox.self = sandbox;
sandbox.globalThis = sandbox;
vm.createContext(sandbox);
vm.runInContext(fs.readFileSync(workerPath, 'utf8'), sandbox);
if (!handler) unknown('the worker registers no message handler');
handler({data: {eventType: 0, paneId: 'pane', graph, showOnNodeItemTypes: {}, nodeDataProviderRuns: {}, config: {},
                groupNodeChildrenCountThreshold: 1000, flattenLayers: false, keepLayersWithASingleChild: false}});
const reply = posted.find((message) => message.eventType === 1);
if (!reply || !reply.modelGraph || !reply.modelGraph.nodesById) unknown('the worker posted no model graph');
const nodes = Object.values(reply.modelGraph.nodesById);
const GROUP = '___group___';
console.log(JSON.stringify({
  collection: collection.label,
  graph: graph.id,
  opNodes: nodes.filter((node) => !node.id.endsWith(GROUP)).map((node) => node.id),
  layers: nodes.filter((node) => node.id.endsWith(GROUP)).map((node) => node.id.slice(0, -GROUP.length)),
  rootNodes: reply.modelGraph.rootNodes.map((node) => node.id),
  edges: nodes.reduce((count, node) => count + (node.incomingEdges || []).length, 0),
}));
