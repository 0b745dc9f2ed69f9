"""What connects jixu to the systems around it (each behind an optional extra): OpenTelemetry traces, MCP tools,
durable pydantic-ai agents, OpenAI Agents SDK agents run on durable steps."""
