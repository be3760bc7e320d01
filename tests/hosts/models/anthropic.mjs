// A scripted Anthropic Messages API on loopback, for Claude Code (ANTHROPIC_BASE_URL). The
// neutral shape of every scripted model is in ../lib.mjs: startModel(decide) → { url, requests,
// toolResults, close() }.
//
// POST /v1/messages (Claude Code adds ?beta=true) with `stream: true` is answered with the SSE
// events of the Messages API: message_start, then per content block content_block_start, its
// deltas (text_delta, or input_json_delta for a tool_use) and content_block_stop, then
// message_delta with stop_reason tool_use or end_turn, and message_stop. Without `stream` the
// same message comes back as one JSON object. POST /v1/messages/count_tokens answers an
// estimate; any other request gets an empty JSON object (and is logged in `requests`).
import { sse, startRecordingServer } from '../lib.mjs';

const MODEL = 'claude-scripted';

/** `<system-reminder>…</system-reminder>` and the like: text Claude Code adds to user turns. */
const REMINDER = /<system-reminder>[\s\S]*?<\/system-reminder>/g;

function blocks(content) {
  return typeof content === 'string' ? [{ type: 'text', text: content }] : (content ?? []);
}

function resultText(content) {
  return blocks(content)
    .filter((b) => b.type === 'text')
    .map((b) => b.text)
    .join('\n');
}

/**
 * What the script decides on, from a Messages request body: the last user prompt (the last user
 * message with text of its own and no tool result, reminders stripped), the tool results after
 * it in order, and the offered tool names.
 */
export function parseRequest(body) {
  const messages = body.messages ?? [];
  const names = new Map(); // tool_use id → tool name
  for (const m of messages) {
    if (m.role !== 'assistant') continue;
    for (const b of blocks(m.content)) if (b.type === 'tool_use') names.set(b.id, b.name);
  }
  let start = -1;
  let prompt = '';
  for (let i = messages.length - 1; i >= 0; i--) {
    const m = messages[i];
    if (m.role !== 'user') continue;
    const bs = blocks(m.content);
    if (bs.some((b) => b.type === 'tool_result')) continue;
    const text = bs
      .filter((b) => b.type === 'text')
      .map((b) => b.text.replace(REMINDER, '').trim())
      .filter(Boolean)
      .join('\n');
    if (text) {
      start = i;
      prompt = text;
      break;
    }
  }
  const results = [];
  for (const m of messages.slice(start + 1)) {
    if (m.role !== 'user') continue;
    for (const b of blocks(m.content)) {
      if (b.type !== 'tool_result') continue;
      results.push({ id: b.tool_use_id, name: names.get(b.tool_use_id), text: resultText(b.content), isError: b.is_error === true });
    }
  }
  const tools = (body.tools ?? []).map((t) => t.name).filter(Boolean);
  return { prompt, results, tools };
}

/** The assistant message for a decision: content blocks and stop reason. */
function message(decision, nextId) {
  if (decision.calls?.length) {
    return {
      content: decision.calls.map((c) => ({ type: 'tool_use', id: nextId('toolu_lab'), name: c.name, input: c.arguments ?? {} })),
      stop_reason: 'tool_use',
    };
  }
  return { content: [{ type: 'text', text: decision.text ?? '' }], stop_reason: 'end_turn' };
}

function usage(body) {
  // A rough, stable estimate: Claude Code shows it, nothing here depends on it.
  return { input_tokens: Math.ceil(JSON.stringify(body.messages ?? []).length / 4), output_tokens: 0 };
}

function streamMessage(res, id, body, msg) {
  const send = sse(res);
  send('message_start', {
    type: 'message_start',
    message: {
      id,
      type: 'message',
      role: 'assistant',
      model: body.model ?? MODEL,
      content: [],
      stop_reason: null,
      stop_sequence: null,
      usage: { ...usage(body), output_tokens: 1, cache_creation_input_tokens: 0, cache_read_input_tokens: 0 },
    },
  });
  send('ping', { type: 'ping' });
  msg.content.forEach((block, index) => {
    if (block.type === 'text') {
      send('content_block_start', { type: 'content_block_start', index, content_block: { type: 'text', text: '' } });
      send('content_block_delta', { type: 'content_block_delta', index, delta: { type: 'text_delta', text: block.text } });
    } else {
      send('content_block_start', {
        type: 'content_block_start',
        index,
        content_block: { type: 'tool_use', id: block.id, name: block.name, input: {} },
      });
      // The arguments in two pieces, as the API streams them.
      const json = JSON.stringify(block.input);
      const cut = Math.floor(json.length / 2);
      for (const partial_json of [json.slice(0, cut), json.slice(cut)]) {
        send('content_block_delta', { type: 'content_block_delta', index, delta: { type: 'input_json_delta', partial_json } });
      }
    }
    send('content_block_stop', { type: 'content_block_stop', index });
  });
  send('message_delta', {
    type: 'message_delta',
    delta: { stop_reason: msg.stop_reason, stop_sequence: null },
    usage: { output_tokens: 10 },
  });
  send('message_stop', { type: 'message_stop' });
  res.end();
}

/**
 * Starts the scripted Messages API. `decide({ prompt, results, tools })` returns
 * `{ calls: [{ name, arguments }] }` or `{ text }` (see ../lib.mjs). Returns
 * { url, requests, toolResults, decisions, close() }: `decisions` logs each model request's
 * parsed view and what the script answered.
 */
export async function startModel(decide) {
  const toolResults = [];
  const seen = new Set();
  const decisions = [];
  let n = 0;
  const nextId = (prefix) => `${prefix}_${String(++n).padStart(4, '0')}`;
  const server = await startRecordingServer(async (req, res, entry) => {
    const url = new URL(req.url, 'http://x');
    if (req.method === 'POST' && url.pathname === '/v1/messages/count_tokens') {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ input_tokens: usage(entry.body ?? {}).input_tokens }));
      return;
    }
    if (req.method === 'POST' && url.pathname === '/v1/messages') {
      const body = entry.body ?? {};
      const view = parseRequest(body);
      for (const r of view.results) {
        if (seen.has(r.id)) continue;
        seen.add(r.id);
        toolResults.push({ name: r.name, text: r.text, isError: r.isError });
      }
      const decision = await decide({
        prompt: view.prompt,
        results: view.results.map(({ name, text, isError }) => ({ name, text, isError })),
        tools: view.tools,
      });
      decisions.push({ ...view, stream: body.stream === true, decision });
      const msg = message(decision, nextId);
      const id = nextId('msg_lab');
      if (body.stream) {
        streamMessage(res, id, body, msg);
        return;
      }
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(
        JSON.stringify({
          id,
          type: 'message',
          role: 'assistant',
          model: body.model ?? MODEL,
          content: msg.content,
          stop_reason: msg.stop_reason,
          stop_sequence: null,
          usage: { ...usage(body), output_tokens: 10 },
        }),
      );
      return;
    }
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end('{}');
  });
  return { ...server, toolResults, decisions };
}
