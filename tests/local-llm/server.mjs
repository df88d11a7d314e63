// A minimal OpenAI-compatible chat-completions endpoint over node-llama-cpp, for end-to-end
// tests against a real small model on 127.0.0.1 (no streaming, no tools). One request at a
// time; usage counted with the model's own tokenizer.
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

async function complete(request) {
  const messages = request.messages ?? [];
  if (messages.length === 0) throw new Error("messages is empty");
  const last = messages[messages.length - 1];
  const history = messages.slice(0, -1).map(m => m.role === "assistant"
    ? {type: "model", response: [text(m.content)]}
    : {type: m.role === "system" ? "system" : "user", text: text(m.content)});
  await sequence.clearHistory();
  const session = new LlamaChatSession({contextSequence: sequence, autoDisposeSequence: false});
  session.setChatHistory(history);
  const reply = await session.prompt(text(last.content), {
    temperature: request.temperature ?? 0,
    maxTokens: request.max_tokens ?? 256,
  });
  session.dispose({disposeSequence: false});
  const promptTokens = model.tokenize(messages.map(m => text(m.content)).join("\n")).length;
  const completionTokens = model.tokenize(reply).length;
  return {
    id: "chatcmpl-local-" + Date.now(), object: "chat.completion",
    created: Math.floor(Date.now() / 1000), model: request.model ?? "local",
    choices: [{index: 0, message: {role: "assistant", content: reply}, finish_reason: "stop"}],
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
