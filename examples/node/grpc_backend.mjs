// A Node product backend calling Apprentice over gRPC: load the .proto files at run time, ask, show the
// answer, send the user's feedback with the answer's interaction id.
//
// Settings (defaults: the local stack of `apprentice up`, run from the repository root):
// APPRENTICE_TARGET (gRPC host:port), APPRENTICE_CA (CA that signed the server's certificate),
// APPRENTICE_API_KEY (a backend key; default: the `default` tenant's key file), APPRENTICE_PROTOS.
import { readFileSync } from "node:fs";
import grpc from "@grpc/grpc-js";
import protoLoader from "@grpc/proto-loader";

const target = process.env.APPRENTICE_TARGET ?? "localhost:50051";
const ca = readFileSync(process.env.APPRENTICE_CA ?? ".apprentice/secrets/ca.pem");
const apiKey = process.env.APPRENTICE_API_KEY
  ?? readFileSync(".apprentice/secrets/backend-default.token", "utf8").trim();
const protos = process.env.APPRENTICE_PROTOS ?? "protos";

const definition = protoLoader.loadSync("apprentice/v1/inference.proto",
  { includeDirs: [protos], keepCase: true, longs: String, enums: String, defaults: true });
const { apprentice } = grpc.loadPackageDefinition(definition);
const credentials = grpc.credentials.combineChannelCredentials(
  grpc.credentials.createSsl(ca),
  grpc.credentials.createFromMetadataGenerator((_params, done) => {
    const metadata = new grpc.Metadata();
    metadata.add("authorization", `Bearer ${apiKey}`);
    done(null, metadata);
  }));
const inference = new apprentice.v1.Inference(target, credentials);
const feedback = new apprentice.v1.Feedback(target, credentials);
const call = (client, method, request) => new Promise((resolve, reject) =>
  client[method](request, { deadline: Date.now() + 30_000 }, (err, reply) => (err ? reject(err) : resolve(reply))));

const reply = await call(inference, "Generate", {
  messages: [{ role: "system", content: "You are the support desk of an online shop." },
             { role: "user", content: "How do I return a parcel?" }],
  sampling: { max_new_tokens: 64, temperature: 0.7 },
  session_id: "user-42-chat-7",
  task: "support",
});
const answer = reply.choices[0];
console.log(answer.text);
// When the user reacts: thumbs (+1/-1), rating (1-5), correction (comment) or kpi (kpi_name, value).
const ack = await call(feedback, "Submit", { interaction_id: answer.interaction_id, kind: "thumbs", value: 1 });

console.log(JSON.stringify({ interaction_id: answer.interaction_id, policy_version: reply.policy_version,
                             feedback_event_id: ack.event_id, accepted: ack.accepted }));
inference.close();
feedback.close();
