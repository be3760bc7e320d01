// A scripted model speaking the OpenAI Responses API (POST …/responses), streamed as SSE the way
// Codex parses it (codex-rs/codex-api/src/sse/responses.rs: response.created,
// response.output_item.added/done, response.output_text.delta, response.completed with an id)
// or answered as one JSON Response when the client asks `stream: false` (the OpenAI Agents SDK's
// plain `run`). Codex also asks GET …/models; it gets an empty list, which makes it use its
// built-in model metadata. Any other request is logged and answered 404, so a test can see
// what a host asked for.
//
// startModel(decide) → { url, requests, toolResults, close() }; see tests/hosts/README.md for
// the neutral interface. `url` is the base URL to configure (it ends in /v1).
import { randomBytes } from 'node:crypto';
import { sse, startRecordingServer } from '../lib.mjs';

const MODEL = 'scripted-model';

/** The text of a content value: a string, or the text parts of an array of content items. */
function textOf(content) {
  if (content == null) return '';
  if (typeof content === 'string') return content;
  if (Array.isArray(content)) return content.map(textOf).join('');
  if (typeof content.text === 'string') return content.text;
  return JSON.stringify(content);
}

function sendJson(res, value, status = 200) {
  res.writeHead(status, { 'content-type': 'application/json' });
  res.end(JSON.stringify(value));
}

/** The host-added user messages that are not the user's prompt (Codex's context blocks). */
function isWrapper(text) {
  const t = text.trimStart();
  return (
    t.startsWith('<environment_context>') ||
    t.startsWith('<user_instructions>') ||
    t.startsWith('# AGENTS.md') ||
    t.startsWith('<permissions') ||
    t.startsWith('<turn_aborted>')
  );
}

/** The request's `input` as a list of items (a bare string is one user message). */
function inputItems(body) {
  const input = body?.input;
  if (typeof input === 'string') return [{ type: 'message', role: 'user', content: input }];
  return Array.isArray(input) ? input : [];
}

function isUserMessage(item) {
  return (item.type === 'message' || item.type === undefined) && item.role === 'user';
}

/**
 * The neutral view of one request: the last real user message's text, the tool results after
 * it (names found through the function_call with the same call_id), and the offered tools.
 */
export function parseRequest(body) {
  const items = inputItems(body);
  let last = -1;
  for (let i = items.length - 1; i >= 0 && last < 0; i--) {
    if (isUserMessage(items[i]) && !isWrapper(textOf(items[i].content))) last = i;
  }
  const prompt = last >= 0 ? textOf(items[last].content) : '';
  const names = new Map();
  const results = [];
  for (const item of items.slice(last + 1)) {
    if (item.type === 'function_call') names.set(item.call_id, qualified(item.namespace, item.name));
    if (item.type === 'function_call_output') {
      const output = item.output;
      const text = typeof output === 'object' && !Array.isArray(output) ? textOf(output.content ?? output) : textOf(output);
      const name = names.get(item.call_id) ?? null;
      results.push({ name, text, isError: isErrorOutput(text), callId: item.call_id });
    }
  }
  return { prompt, results, tools: toolNames(body?.tools) };
}

/** Codex hands an MCP error back as text; the MCP result's isError survives only inside it. */
function isErrorOutput(text) {
  try {
    const v = JSON.parse(text);
    return v?.isError === true || v?.is_error === true;
  } catch {
    return false;
  }
}

/**
 * Codex 0.169 offers each MCP server's tools inside one `namespace` tool (`mcp__SERVER` holding
 * `charge`, …) and expects a call to name both. The neutral name is `NAMESPACE__TOOL`, the form
 * Codex shows to users; `splitName` undoes it.
 */
const SEP = '__';
function qualified(namespace, name) {
  return namespace ? `${namespace}${SEP}${name}` : name;
}

/** Function tool names, namespaced ones qualified. */
function toolNames(tools, namespace = null) {
  const out = [];
  for (const t of tools ?? []) {
    if (t.type === 'namespace' && Array.isArray(t.tools)) out.push(...toolNames(t.tools, t.name));
    else if (t.name) out.push(qualified(namespace, t.name));
  }
  return out;
}

/** { namespace, name } for a neutral tool name, looked up among the request's namespaces. */
function splitName(tools, neutral) {
  for (const t of tools ?? []) {
    if (t.type !== 'namespace' || !neutral.startsWith(t.name + SEP)) continue;
    const name = neutral.slice(t.name.length + SEP.length);
    if ((t.tools ?? []).some((x) => x.name === name)) return { namespace: t.name, name };
  }
  return { name: neutral };
}

function id(prefix) {
  return `${prefix}_${randomBytes(12).toString('hex')}`;
}

/** The output items of one scripted answer. */
function outputItems(answer, tools) {
  if (answer.calls?.length) {
    return answer.calls.map((c) => ({
      type: 'function_call',
      id: id('fc'),
      call_id: id('call'),
      ...splitName(tools, c.name),
      arguments: JSON.stringify(c.arguments ?? {}),
      status: 'completed',
    }));
  }
  return [
    {
      type: 'message',
      id: id('msg'),
      role: 'assistant',
      status: 'completed',
      content: [{ type: 'output_text', text: answer.text ?? '', annotations: [] }],
    },
  ];
}

const USAGE = {
  input_tokens: 10,
  input_tokens_details: { cached_tokens: 0 },
  output_tokens: 5,
  output_tokens_details: { reasoning_tokens: 0 },
  total_tokens: 15,
};

function responseObject(respId, status, output) {
  return {
    id: respId,
    object: 'response',
    created_at: Math.floor(Date.now() / 1000),
    status,
    model: MODEL,
    output,
    parallel_tool_calls: true,
    tool_choice: 'auto',
    tools: [],
    usage: status === 'completed' ? USAGE : null,
  };
}

/** The SSE events of one answer, in the order the real API sends them. */
function streamEvents(respId, output) {
  const ev = [];
  let seq = 0;
  const push = (type, data) => ev.push([type, { type, sequence_number: seq++, ...data }]);
  push('response.created', { response: responseObject(respId, 'in_progress', []) });
  output.forEach((item, index) => {
    if (item.type === 'function_call') {
      push('response.output_item.added', {
        output_index: index,
        item: { ...item, arguments: '', status: 'in_progress' },
      });
      push('response.function_call_arguments.delta', {
        item_id: item.id,
        output_index: index,
        delta: item.arguments,
      });
      push('response.function_call_arguments.done', {
        item_id: item.id,
        output_index: index,
        arguments: item.arguments,
      });
    } else {
      const text = item.content[0].text;
      push('response.output_item.added', {
        output_index: index,
        item: { ...item, status: 'in_progress', content: [] },
      });
      const part = { type: 'output_text', text: '', annotations: [] };
      push('response.content_part.added', { item_id: item.id, output_index: index, content_index: 0, part });
      push('response.output_text.delta', { item_id: item.id, output_index: index, content_index: 0, delta: text });
      push('response.output_text.done', { item_id: item.id, output_index: index, content_index: 0, text });
      push('response.content_part.done', {
        item_id: item.id,
        output_index: index,
        content_index: 0,
        part: { ...part, text },
      });
    }
    push('response.output_item.done', { output_index: index, item });
  });
  push('response.completed', { response: responseObject(respId, 'completed', output) });
  return ev;
}

export async function startModel(decide) {
  const toolResults = [];
  const seen = new Set();
  const server = await startRecordingServer(async (_req, res, req) => {
    const pathname = new URL(req.path, 'http://x').pathname;
    if (req.method === 'POST' && pathname.endsWith('/responses')) {
      const view = parseRequest(req.body);
      // A request repeats the whole conversation: record each tool result once, by call id.
      for (const r of view.results) if (!seen.has(r.callId)) seen.add(r.callId), toolResults.push(r);
      const answer = await decide(view);
      const output = outputItems(answer, req.body?.tools);
      const respId = id('resp');
      if (req.body?.stream) {
        const send = sse(res);
        for (const [event, data] of streamEvents(respId, output)) send(event, data);
        res.end();
      } else sendJson(res, responseObject(respId, 'completed', output));
      return;
    }
    if (req.method === 'GET' && pathname.endsWith('/models')) {
      sendJson(res, { object: 'list', data: [{ id: MODEL, object: 'model' }], models: [] });
      return;
    }
    sendJson(res, { error: { message: `scripted model: no ${req.method} ${pathname}` } }, 404);
  });

  return { url: `${server.url}/v1`, requests: server.requests, toolResults, close: server.close };
}
