// A Go product backend calling Apprentice over gRPC with the stubs generated from protos/ (clients/README.md):
// ask, show the answer, send the user's feedback with the answer's interaction id.
//
// Settings (defaults: the local stack of `apprentice up`, run from the repository root):
// APPRENTICE_TARGET (gRPC host:port), APPRENTICE_CA (CA that signed the server's certificate),
// APPRENTICE_API_KEY (a backend key; default: the `default` tenant's key file).
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"

	apprenticev1 "github.com/apprentice-llm/apprentice/clients/go/apprentice/v1"
)

func setting(name, fallback string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return fallback
}

func main() {
	target := setting("APPRENTICE_TARGET", "localhost:50051")
	caFile := setting("APPRENTICE_CA", ".apprentice/secrets/ca.pem")
	apiKey := os.Getenv("APPRENTICE_API_KEY")
	if apiKey == "" {
		b, err := os.ReadFile(".apprentice/secrets/backend-default.token")
		if err != nil {
			log.Fatal(err)
		}
		apiKey = strings.TrimSpace(string(b))
	}

	tlsCreds, err := credentials.NewClientTLSFromFile(caFile, "")
	if err != nil {
		log.Fatal(err)
	}
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(tlsCreds))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+apiKey)

	reply, err := apprenticev1.NewInferenceClient(conn).Generate(ctx, &apprenticev1.GenerateRequest{
		Messages: []*apprenticev1.ChatMessage{
			{Role: "system", Content: "You are the support desk of an online shop."},
			{Role: "user", Content: "How do I return a parcel?"},
		},
		Sampling:  &apprenticev1.SamplingParams{MaxNewTokens: 64, Temperature: 0.7},
		SessionId: "user-42-chat-7",
		Task:      "support",
	})
	if err != nil {
		log.Fatal(err)
	}
	answer := reply.GetChoices()[0]
	fmt.Println(answer.GetText())
	// When the user reacts: thumbs (+1/-1), rating (1-5), correction (Comment) or kpi (KpiName, Value).
	ack, err := apprenticev1.NewFeedbackClient(conn).Submit(ctx, &apprenticev1.FeedbackRequest{
		InteractionId: answer.GetInteractionId(), Kind: "thumbs", Value: 1,
	})
	if err != nil {
		log.Fatal(err)
	}

	out, _ := json.Marshal(map[string]any{"interaction_id": answer.GetInteractionId(),
		"policy_version": reply.GetPolicyVersion(), "feedback_event_id": ack.GetEventId(), "accepted": ack.GetAccepted()})
	fmt.Println(string(out))
}
