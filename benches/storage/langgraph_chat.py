"""The peer of Contexture's request-record benchmark: the same 1,000-message conversation
(500 turns, the same texts) kept by LangGraph's SQLite checkpointer, which stores each step's
whole state. Prints the database's bytes on disk per byte of message text, and the time of a
turn at the end of the conversation.

    python3 -m pip install langgraph langgraph-checkpoint-sqlite
    python3 benches/storage/langgraph_chat.py
"""

import json
import os
import sqlite3
import tempfile
import time

from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, MessagesState, StateGraph

TURNS = 500
WORDS = ["context", "window", "thread", "model", "request", "message", "store", "fit"]


def prose(turn: int, length: int) -> str:
    """The text Contexture's storage benchmark writes for `turn` (`contexture_store::testing::prose`)."""
    text = f"turn {turn}:"
    i = turn
    while len(text) < length:
        text += " " + WORDS[i % len(WORDS)]
        i = (i * 31 + 7) % (1 << 64)
    return text


def length(turn: int) -> int:
    return 40 + (turn * 7919) % 960 * ((turn % 3) + 1) // 3


def answer(state: MessagesState):
    turn = (len(state["messages"]) - 1) // 2
    return {"messages": [{"role": "assistant", "content": prose(turn + TURNS, length(turn + TURNS))}]}


def main() -> None:
    directory = tempfile.mkdtemp(prefix="langgraph-chat-")
    path = os.path.join(directory, "checkpoints.db")
    connection = sqlite3.connect(path, check_same_thread=False)
    saver = SqliteSaver(connection)
    graph = StateGraph(MessagesState)
    graph.add_node("answer", answer)
    graph.add_edge(START, "answer")
    graph.add_edge("answer", END)
    app = graph.compile(checkpointer=saver)
    config = {"configurable": {"thread_id": "chat"}}
    text = 0
    last_turns = []
    for turn in range(TURNS):
        question = prose(turn, length(turn))
        start = time.perf_counter()
        state = app.invoke({"messages": [{"role": "user", "content": question}]}, config)
        if turn >= TURNS - 20:
            last_turns.append(time.perf_counter() - start)
    for message in state["messages"]:
        role = "user" if message.type == "human" else "assistant"
        text += len(json.dumps({"role": role, "content": message.content}, separators=(",", ":")))
    connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    connection.commit()
    disk = os.path.getsize(path)
    turn_ms = 1000 * sum(last_turns) / len(last_turns)
    print(
        f"langgraph {len(state['messages'])} messages: {text} bytes of message text, "
        f"{disk} bytes on disk ({disk / text:.2f}x the text); "
        f"a turn at the end: {turn_ms:.2f} ms (mean of the last 20)"
    )


if __name__ == "__main__":
    main()
