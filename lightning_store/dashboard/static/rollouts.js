// The rollout page: a link to a timeline row (#span-…) opens that row, so its attributes show at once.
"use strict";

function openLinkedSpan() {
  const id = decodeURIComponent(window.location.hash.slice(1));
  if (!id.startsWith("span-")) return;
  const target = document.getElementById(id);
  if (target && target.tagName === "DETAILS") {
    target.open = true;
    target.scrollIntoView({ block: "center" });
  }
}

document.addEventListener("DOMContentLoaded", openLinkedSpan);
window.addEventListener("hashchange", openLinkedSpan);
