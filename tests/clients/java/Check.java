// Uses the generated Java stubs the way a backend would (tests/clients/test_codegen.py compiles and runs
// it): build a request, round-trip it through bytes, and call Generate and Feedback through the stubs
// (compiled only: a channel needs a transport such as grpc-netty-shaded, which a backend adds).
package dev.apprentice.check;

import dev.apprentice.v1.ChatMessage;
import dev.apprentice.v1.FeedbackAck;
import dev.apprentice.v1.FeedbackGrpc;
import dev.apprentice.v1.FeedbackRequest;
import dev.apprentice.v1.GenerateRequest;
import dev.apprentice.v1.GenerateResponse;
import dev.apprentice.v1.InferenceGrpc;
import dev.apprentice.v1.SamplingParams;
import io.grpc.Channel;

public final class Check {
  static GenerateRequest request() {
    return GenerateRequest.newBuilder()
        .addMessages(ChatMessage.newBuilder().setRole("user").setContent("Where is my order?"))
        .setSampling(SamplingParams.newBuilder().setMaxNewTokens(64).setTemperature(0.7f))
        .build();
  }

  static FeedbackAck askAndRate(Channel channel) {
    GenerateResponse r = InferenceGrpc.newBlockingStub(channel).generate(request());
    return FeedbackGrpc.newBlockingStub(channel).submit(FeedbackRequest.newBuilder()
        .setInteractionId(r.getChoices(0).getInteractionId()).setKind("thumbs").setValue(1).build());
  }

  public static void main(String[] args) throws Exception {
    GenerateRequest back = GenerateRequest.parseFrom(request().toByteArray());
    System.out.println(InferenceGrpc.getGenerateMethod().getFullMethodName() + " "
        + FeedbackGrpc.getSubmitMethod().getFullMethodName() + " " + back.getMessages(0).getContent());
  }
}
