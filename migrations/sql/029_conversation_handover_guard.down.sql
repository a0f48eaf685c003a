DROP TRIGGER "Arbor_conversation_handover_guard" ON {schema}.conversations;
DROP FUNCTION {schema}.conversation_handover_guard();
