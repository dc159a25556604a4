"""Message-broker destinations: RabbitMQ (AMQP 0-9-1), NATS JetStream, Redis Streams and MQTT.

The pure rules (a hook's URL and keys, the `{{field}}` templates of its routing key, subject,
stream or topic, and the headers each broker carries) sit beside one publisher per broker,
which keeps its connections and says what the broker answered. docs/brokers.md.
"""
