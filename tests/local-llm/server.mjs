// A minimal OpenAI-compatible chat-completions endpoint over node-llama-cpp, for end-to-end
// tests against a real small model on 127.0.0.1 (no streaming). One request at a time; usage
// counted with the model's own tokenizer. Tools: when a request offers `tools`, the reply is
// constrained by a JSON grammar to either `{"tool": NAME, "input": TEXT}` (returned as a tool
// call whose arguments put TEXT in the tool's first parameter) or `{"answer": TEXT}` (returned
// as text), as llama.cpp's server does for models without a tool-call format of their own;
// earlier tool calls and results are shown to the model in the same JSON and as user turns.
//   MODEL=/path/to/model.gguf PORT=8013 node server.mjs
import http from "node:http";
import {getLlama, LlamaChatSession} from "node-llama-cpp";

const llama = await getLlama({gpu: false, build: "never"});
const model = await llama.loadModel({modelPath: process.env.MODEL});
const context = await model.createContext({contextSize: 8192, threads: 2});
const sequence = context.getSequence();
let queue = Promise.resolve();

function text(content) {
  if (typeof content === "string") return content;
  if (Array.isArray(content)) return content.map(part => part.text ?? "").join("");
  return "";
}

// A message as the model reads it: tool calls in the grammar's JSON, results as user turns.
function shown(m) {
  if (m.role === "assistant" && Array.isArray(m.tool_calls) && m.tool_calls.length > 0) {
    const call = m.tool_calls[0].function ?? {};
    let input = "";
    try { input = Object.values(JSON.parse(call.arguments || "{}"))[0] ?? ""; } catch {}
    return {type: "model", response: [JSON.stringify({tool: call.name, input: String(input)})]};
  }
  if (m.role === "assistant") return {type: "model", response: [text(m.content)]};
  if (m.role === "tool") return {type: "user", text: `Tool result (${m.tool_call_id}):\n${text(m.content)}`};
  return {type: m.role === "system" ? "system" : "user", text: text(m.content)};
}

let calls = 0;

async function complete(request) {
  const messages = request.messages ?? [];
  if (messages.length === 0) throw new Error("messages is empty");
  const tools = (request.tools ?? []).map(tool => tool.function ?? tool).filter(f => f.name);
  const turns = messages.map(shown);
  const last = turns.pop();
  const question = last.type === "user" || last.type === "system" ? last.text : last.response.join("");
  await sequence.clearHistory();
  const session = new LlamaChatSession({contextSequence: sequence, autoDisposeSequence: false});
  session.setChatHistory(turns);
  const grammar = tools.length === 0 ? undefined : await llama.createGrammarForJsonSchema({
    oneOf: [
      {type: "object", properties: {tool: {enum: tools.map(f => f.name)}, input: {type: "string"}}},
      {type: "object", properties: {answer: {type: "string"}}},
    ],
  });
  const reply = await session.prompt(question, {
    temperature: request.temperature ?? 0,
    maxTokens: request.max_tokens ?? 256,
    grammar,
  });
  session.dispose({disposeSequence: false});
  let message = {role: "assistant", content: reply};
  let finish = "stop";
  if (grammar) {
    let parsed = null;
    try { parsed = JSON.parse(reply); } catch {}
    if (parsed && typeof parsed.tool === "string") {
      const tool = tools.find(f => f.name === parsed.tool);
      const parameter = Object.keys(tool?.parameters?.properties ?? {})[0] ?? "input";
      calls += 1;
      message = {role: "assistant", content: null, tool_calls: [{
        id: `call_${calls}`, type: "function",
        function: {name: parsed.tool, arguments: JSON.stringify({[parameter]: parsed.input ?? ""})},
      }]};
      finish = "tool_calls";
    } else if (parsed && typeof parsed.answer === "string") {
      message = {role: "assistant", content: parsed.answer};
    }
  }
  const promptTokens = model.tokenize(messages.map(m => text(m.content)).join("\n")).length;
  const completionTokens = model.tokenize(reply).length;
  return {
    id: "chatcmpl-local-" + Date.now(), object: "chat.completion",
    created: Math.floor(Date.now() / 1000), model: request.model ?? "local",
    choices: [{index: 0, message, finish_reason: finish}],
    usage: {prompt_tokens: promptTokens, completion_tokens: completionTokens,
            total_tokens: promptTokens + completionTokens},
  };
}

http.createServer((req, res) => {
  if (req.method === "GET" && req.url === "/v1/models") {
    res.writeHead(200, {"Content-Type": "application/json"})
      .end(JSON.stringify({object: "list", data: [{id: "smollm2", object: "model"}]}));
    return;
  }
  if (req.method !== "POST" || req.url !== "/v1/chat/completions") {
    res.writeHead(404).end();
    return;
  }
  let body = "";
  req.on("data", chunk => body += chunk);
  req.on("end", () => {
    queue = queue
      .then(() => complete(JSON.parse(body)))
      .then(out => res.writeHead(200, {"Content-Type": "application/json"}).end(JSON.stringify(out)))
      .catch(error => res.writeHead(500, {"Content-Type": "application/json"})
        .end(JSON.stringify({error: {message: String(error)}})));
  });
}).listen(Number(process.env.PORT ?? 8013), "127.0.0.1", () => console.log("listening"));
